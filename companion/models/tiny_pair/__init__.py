"""The closed-world pair, frozen: what its committed assets need, and no recipe to rebuild them.

The pair in ``companion/assets/default_pair`` (``companion.models.loading.load_pair("closed-world")``; a
5M-parameter ``Qwen3ForCausalLM`` target and its 0.5M-parameter distilled drafter, both float16,
trained on rule-generated closed-task chat conversations plus a 15 % share of standard-library
source) was built once, offline and seeded, by ``companion retrain``. That command and its
training code (recipe, BPE training, windows, the copy probe, the per-task report) were retired
when the chapters moved to real models: the assets are frozen, and their ``manifest.json``
records the recipe (``config``), corpus, figures and file digests; the folder's ``README.md``
says how they were made and where the retired code is in git history.

What stays is what tests of real claims read: the corpus split (:mod:`.corpus`; the held-out
standard-library files the decoder tests continue), the closed task set that wrote the pair's
prompts (:mod:`.closed_tasks`, :mod:`.chat_basics`, :mod:`.chat_corpus`; its answers are
enumerable, :mod:`.tasks_report`), reading and checking the pair folder (:mod:`.pair_folder`,
``companion pair-report``) and transformers' assisted generation on a pair (:mod:`.evaluate`).
"""
from __future__ import annotations

from companion.assets import DEFAULT_PAIR_DIR

#: Folder of the committed pair (``companion.assets.DEFAULT_PAIR_DIR``), under the package's name for it.
ASSET_DIR = DEFAULT_PAIR_DIR

"""Files shipped with the package: the frozen closed-world pair (read by :mod:`companion.models.loading`
and checked by :mod:`companion.models.tiny_pair`), SmolLM2's distilled drafter, the chat requests
(:mod:`companion.prompts.chat_requests`) and the registry of models on the package index
(``package_weights.json``, read by :mod:`companion.models.weights.registry`)."""
from __future__ import annotations

from pathlib import Path

#: Folder of the committed pair: ``tokenizer/``, ``target/``, ``drafter/``, ``prompts.jsonl``, ``manifest.json``.
DEFAULT_PAIR_DIR: Path = Path(__file__).resolve().parent / "default_pair"

#: Folder of SmolLM2-135M-Instruct's drafter (``companion build-drafter``): ``config.json``,
#: ``generation_config.json``, ``model.safetensors``, ``manifest.json``; no tokenizer (the target's).
SMOLLM2_DRAFTER_DIR: Path = Path(__file__).resolve().parent / "smollm2_drafter"

#: Folder of the chat-request prompt set written for this project (:mod:`companion.prompts.chat_requests`): ``prompts.jsonl``.
CHAT_REQUESTS_DIR: Path = Path(__file__).resolve().parent / "chat_requests"

#: Folder of the coding requests quoting the standard library's documentation (:mod:`companion.prompts.stdlib_requests`):
#: ``requests.json`` (the family, frozen) and ``prompts.jsonl`` (in SmolLM2's template).
STDLIB_REQUESTS_DIR: Path = Path(__file__).resolve().parent / "stdlib_requests"

#: Folder of the full profile's committed per-step summary and manifest (:mod:`companion.harvest.full_profile`).
FULL_PROFILE_DIR: Path = Path(__file__).resolve().parent / "full_profile"

#: Folder of the stability profile's committed per-step summaries and manifest (:mod:`companion.harvest.stability_profile`).
STABILITY_PROFILE_DIR: Path = Path(__file__).resolve().parent / "stability_profile"

#: Folder of the committed kernel-path measurements, ``<preset>.json`` (``benchmarks/measure_kernel_paths.py``,
#: read by :mod:`companion.harvest.kernel_paths`).
KERNEL_PATHS_DIR: Path = Path(__file__).resolve().parent / "kernel_paths"

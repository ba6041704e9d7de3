"""Harvest presets: SmolLM2 and the closed-world pair on a CPU, and the paper's two Qwen3 settings.

======================== ============================ ============================ ===============================
preset                   target                       drafter                      prompts
======================== ============================ ============================ ===============================
``qwen2.5-coder``        Qwen2.5-Coder-1.5B-Instruct  Qwen2.5-Coder-0.5B-Instruct  the project's chat requests
``qwen2.5-coder-0.5b``   Qwen2.5-Coder-0.5B-Instruct  none                         the project's chat requests
``smollm2``              SmolLM2-135M-Instruct        distilled here               the project's chat requests
``closed-world``         embedded target              embedded drafter             the embedded held-out prompt set
``paper-qwen3-1.7b``     Qwen/Qwen3-1.7B              Qwen/Qwen3-0.6B              500 UltraChat-200k prompts
``paper-qwen3-4b``       Qwen/Qwen3-4B                Qwen/Qwen3-0.6B              the same 500 prompts
======================== ============================ ============================ ===============================

``default`` is the former name of ``closed-world`` and still means it. ``qwen2.5-coder`` is the
book's main pair on a CPU: Qwen's own Q4_K_M GGUF files of Qwen2.5-Coder-1.5B-Instruct and
0.5B-Instruct (Apache-2.0), dequantised to bfloat16 (float32 on a CPU without bf16), from the
package index (:mod:`companion.weights.convert`); their vocabulary (151,936) is the size of Qwen3's.
``qwen2.5-coder-0.5b`` is the 0.5B as a target on its own, and ``smollm2`` the small model with the
drafter this project distilled for it (the weights, likewise, from the package index). Their prompts are written for this project in the paper's shape (chat requests of many
kinds, at least 64 tokens with the chat template; :mod:`companion.chat_requests`).

All of them decode 128 greedy steps per prompt and compute the paper's criteria
(:data:`companion.criteria.PAPER_CRITERIA`) and trees ``m = 1, 2, 4, 8``. The paper ran no
drafter; Qwen3-0.6B is this companion's extension (``--no-drafter`` reproduces the paper's
target-only setting exactly).

Choices the paper leaves open, and ours (the book renders this docstring):

* **Dataset and split.** ``HuggingFaceH4/ultrachat_200k``, split ``train_sft`` (207,865
  conversations): the split that is the dataset proper; ``test_sft`` is a 23k held-out copy for
  fine-tuning evaluation, and the ``*_gen`` splits hold the same prompts for generation. Neither
  model was fine-tuned on it by us, so "train" carries no leakage meaning here.
* **Prompt text.** The first user turn of each conversation (the dataset's ``prompt`` column,
  equal to ``messages[0].content``), as one user message; later turns are not used.
* **Chat template.** The target tokenizer's own template, ``add_generation_prompt=True``, so
  decoding starts where the assistant's answer starts.
* **Thinking mode.** ``enable_thinking=False``. Qwen3's template then closes an empty
  ``<think></think>`` block, and the 128 steps are the answer itself. With thinking on, they would
  be the opening of a reasoning trace, and Qwen's model cards advise against greedy decoding in
  thinking mode (it degenerates into repetition), while the paper decodes greedily. ``--enable-thinking``
  switches it for a comparison.
* **The 64-token minimum** is measured on the chat-templated text, in the target's tokenizer.
* **Random sampling (seed 0).** Conversations are ranked by ``sha256(f"{seed}:{prompt_id}")``
  and scanned in that order, keeping each whose templated first turn has at least 64 tokens,
  until 500 are kept. A hash of the dataset's own ``prompt_id`` makes the sample independent of
  row order, library versions and random-number generators; duplicates of a ``prompt_id`` are
  skipped. ``--write-prompts FILE`` saves the selection; ``--prompts FILE`` reuses it.
* **Truncation.** None: prompts are used whole (UltraChat first turns are at most a few
  thousand tokens; Qwen3 has 40,960 positions). Batches are formed from length-sorted prompts
  so padding stays small.
* **End of sequence.** A prompt's trace ends at its first EOS (``<|im_end|>`` or
  ``<|endoftext|>``, from the model's generation config), which is how "128 steps each" can
  total "about 63k" for 500 prompts rather than 64,000. ``--no-stop-at-eos`` decodes past it.
* **Precision.** bfloat16 on CUDA, the models' native dtype; statistics in float64 from the
  logits (see :mod:`companion.harvest.stats`).

Prompts come from the ``datasets`` library when it is installed (it is not a dependency of
this package: ``pip install datasets``, and the machine must reach the hub or have the dataset
in its cache), or from local files: ``--ultrachat PATH`` takes the dataset's own Parquet files
(a ``train_sft-*.parquet`` file or a folder of them, as in the hub repository) or a JSONL
export of it, and runs the selection above; ``--prompts FILE.jsonl`` takes a ready prompt set
in :mod:`companion.prompts` format and uses it verbatim.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from companion.criteria import PAPER_CRITERIA
from companion.prompts import Prompt

ULTRACHAT = "HuggingFaceH4/ultrachat_200k"
ULTRACHAT_SPLIT = "train_sft"


@dataclass(frozen=True)
class Preset:
    """A named harvest setting: models, prompt source and the harvest's own parameters."""

    name: str
    description: str
    target: str
    drafter: str | None
    tokenizer: str | None = None
    prompts: str = "default"  # a companion prompt set name, or "ultrachat"
    n_prompts: int | None = None  # None: the whole prompt set
    min_prompt_tokens: int = 0
    n_steps: int = 128
    criteria: tuple[str, ...] = PAPER_CRITERIA
    tree_widths: tuple[int, ...] = (1, 2, 4, 8)
    seed: int = 0
    enable_thinking: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    "qwen2.5-coder": Preset(
        name="qwen2.5-coder",
        description="Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct as its drafter (Q4_K_M GGUF from "
                    "the package index, in bfloat16), on the project's chat requests (held-out split; runs on a CPU)",
        target="qwen2.5-coder", drafter="qwen2.5-coder", prompts="chat-and-stdlib", min_prompt_tokens=64,
    ),
    "qwen2.5-coder-0.5b": Preset(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct as a target on its own (Q4_K_M GGUF from the package index, in "
                    "bfloat16), on the project's chat requests (held-out split; runs on a CPU)",
        target="qwen2.5-coder-0.5b", drafter=None, prompts="chat-and-stdlib", min_prompt_tokens=64,
    ),
    "smollm2": Preset(
        name="smollm2",
        description="SmolLM2-135M-Instruct, a real instruct LLM from the package index, on the project's chat "
                    "requests (held-out split; runs on a CPU)",
        target="smollm2", drafter="smollm2", prompts="chat-and-stdlib", min_prompt_tokens=64,
    ),
    "closed-world": Preset(
        name="closed-world",
        description="the embedded tiny Qwen3 pair, trained on a closed world, and its held-out prompts (runs on a CPU)",
        target="default", drafter="default", prompts="default",
    ),
    "default": Preset(
        name="default",
        description="the former name of closed-world: the embedded tiny Qwen3 pair and its held-out prompts",
        target="default", drafter="default", prompts="default",
    ),
    "paper-qwen3-1.7b": Preset(
        name="paper-qwen3-1.7b",
        description="the paper's Qwen3-1.7B setting, with Qwen3-0.6B as drafter (our extension)",
        target="Qwen/Qwen3-1.7B", drafter="Qwen/Qwen3-0.6B", prompts="ultrachat", n_prompts=500, min_prompt_tokens=64,
    ),
    "paper-qwen3-4b": Preset(
        name="paper-qwen3-4b",
        description="the paper's Qwen3-4B setting, with Qwen3-0.6B as drafter (our extension)",
        target="Qwen/Qwen3-4B", drafter="Qwen/Qwen3-0.6B", prompts="ultrachat", n_prompts=500, min_prompt_tokens=64,
    ),
}


class PromptsUnavailableError(RuntimeError):
    """The preset's prompts cannot be loaded here; the message says what to do."""


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown harvest preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def check_default_assets(parts: Iterable[str] = ("target", "drafter", "prompts")) -> None:
    """Raise ``FileNotFoundError`` with instructions when a part of the embedded pair is not in this checkout."""
    from companion.tiny_pair import ASSET_DIR

    files = {"target": ASSET_DIR / "target" / "config.json", "drafter": ASSET_DIR / "drafter" / "config.json",
             "tokenizer": ASSET_DIR / "tokenizer", "prompts": ASSET_DIR / "prompts.jsonl"}
    wanted = list(parts)
    if "target" in wanted:
        wanted.append("tokenizer")
    missing = [str(files[p]) for p in wanted if not files[p].exists()]
    if missing:
        raise FileNotFoundError(
            "the 'default' preset needs the embedded pair, which is not in this checkout "
            f"(missing: {', '.join(missing)}). Restore it from the repository (`git checkout -- {ASSET_DIR}`), "
            "or give the models and prompts yourself: --target DIR --drafter DIR --prompts FILE.jsonl")


# -------------------------------------------------------------------------------------------------
# UltraChat


def ultrachat_rows(source: str | Path | None = None) -> Iterator[dict[str, Any]]:
    """Rows ``{"prompt_id", "prompt", "index"}`` of UltraChat-200k ``train_sft``.

    ``source`` None: through ``datasets.load_dataset`` (lazy import; a clear error if the library
    is missing). Otherwise a ``.parquet`` file, a folder of ``train_sft*.parquet`` files (the hub
    repository's layout: ``data/train_sft-*.parquet``), or a ``.jsonl`` file with ``prompt_id``
    and ``prompt`` (or ``messages``) per line. ``index`` is the row's position in the source.
    """
    if source is None:
        try:
            import datasets
        except ImportError as err:
            raise PromptsUnavailableError(
                f"the paper presets draw their prompts from {ULTRACHAT} (split {ULTRACHAT_SPLIT}), which needs the "
                "`datasets` library: `pip install datasets`, on a machine that can download the dataset (or has it "
                "in its Hugging Face cache). Alternatively pass --ultrachat PATH (the dataset's Parquet files) or "
                "--prompts FILE.jsonl (a ready prompt set).") from err
        try:
            ds = datasets.load_dataset(ULTRACHAT, split=ULTRACHAT_SPLIT)
        except Exception as err:  # network, cache, auth: all end the same way for the user
            raise PromptsUnavailableError(
                f"could not load {ULTRACHAT} ({ULTRACHAT_SPLIT}) with `datasets`: {type(err).__name__}: {err}. "
                "Download it where there is network (it is then in the Hugging Face cache), or pass --ultrachat PATH "
                "or --prompts FILE.jsonl.") from err
        columns = [c for c in ("prompt_id", "prompt", "messages") if c in ds.column_names]
        for i, row in enumerate(ds.select_columns(columns)):
            yield _row(row, i)
        return
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob(f"**/{ULTRACHAT_SPLIT}*.parquet"))
        if not files:
            raise PromptsUnavailableError(f"no {ULTRACHAT_SPLIT}*.parquet files under {path}")
    elif path.is_file():
        files = [path]
    else:
        raise PromptsUnavailableError(f"{path} does not exist")
    index = 0
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            schema = pq.read_schema(f)
            columns = [c for c in ("prompt_id", "prompt") if c in schema.names] or None
            if columns is None or "prompt" not in columns:
                columns = [c for c in ("prompt_id", "messages") if c in schema.names]
            for row in pq.read_table(f, columns=columns).to_pylist():
                yield _row(row, index)
                index += 1
        else:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        yield _row(json.loads(line), index)
                        index += 1


def _row(row: dict[str, Any], index: int) -> dict[str, Any]:
    text = row.get("prompt")
    if text is None:
        messages = row.get("messages") or []
        users = [m["content"] for m in messages if m.get("role") == "user"]
        if not users:
            raise ValueError(f"UltraChat row {index} has neither 'prompt' nor a user message")
        text = users[0]
    pid = row.get("prompt_id") or hashlib.sha256(text.encode()).hexdigest()
    return {"prompt_id": str(pid), "prompt": text, "index": index}


def sample_key(seed: int, prompt_id: str) -> str:
    """The rank of a conversation in the seeded random order: ``sha256(f"{seed}:{prompt_id}")``."""
    return hashlib.sha256(f"{seed}:{prompt_id}".encode()).hexdigest()


def chat_prompt(tokenizer: Any, text: str, *, enable_thinking: bool = False) -> str:
    """``text`` as one user turn in the tokenizer's chat template, ready for the assistant's answer."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; the UltraChat presets need a chat model's tokenizer")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=enable_thinking)


def select_ultrachat_prompts(rows: Iterable[dict[str, Any]], tokenizer: Any, *, n: int = 500, min_tokens: int = 64,
                             seed: int = 0, enable_thinking: bool = False) -> list[Prompt]:
    """The preset's sample: rows in seeded hash order, kept when the templated turn has >= ``min_tokens`` tokens.

    Returns fewer than ``n`` only if the rows run out (then raises ``ValueError``: a smaller set
    would silently change the experiment).
    """
    unique: dict[str, dict[str, Any]] = {}
    for row in rows:
        unique.setdefault(row["prompt_id"], row)
    ranked = sorted(unique.values(), key=lambda r: sample_key(seed, r["prompt_id"]))
    chosen: list[Prompt] = []
    for row in ranked:
        text = chat_prompt(tokenizer, row["prompt"], enable_thinking=enable_thinking)
        n_tok = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n_tok >= min_tokens:
            chosen.append(Prompt(row["prompt_id"], text, n_tok, f"{ULTRACHAT}:{ULTRACHAT_SPLIT}", row["index"]))
            if len(chosen) == n:
                return chosen
    raise ValueError(f"only {len(chosen)} of {len(unique)} conversations have >= {min_tokens} templated tokens; "
                     f"{n} were asked for")

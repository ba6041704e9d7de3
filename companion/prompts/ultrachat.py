"""UltraChat-200k first turns: the paper presets' prompts, sampled as the paper describes.

The paper measured its targets on 500 random UltraChat-200k first turns with at least 64 prompt
tokens once chat-templated. The presets ``paper-qwen3-1.7b`` and ``paper-qwen3-4b``
(:mod:`companion.models.presets`) take their prompts from here. Choices the paper leaves open, and
ours (the book renders this docstring):

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

Prompts come from the ``datasets`` library when it is installed (it is not a dependency of
this package: ``pip install datasets``, and the machine must reach the hub or have the dataset
in its cache), or from local files: ``--ultrachat PATH`` takes the dataset's own Parquet files
(a ``train_sft-*.parquet`` file or a folder of them, as in the hub repository) or a JSONL
export of it, and runs the selection above; ``--prompts FILE.jsonl`` takes a ready prompt set
in :mod:`companion.prompts.sets` format and uses it verbatim.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from companion.prompts.sets import Prompt

ULTRACHAT = "HuggingFaceH4/ultrachat_200k"
ULTRACHAT_SPLIT = "train_sft"


class PromptsUnavailableError(RuntimeError):
    """The preset's prompts cannot be loaded here; the message says what to do."""


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

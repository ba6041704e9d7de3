"""Code prompts from held-out source files, and the prompt file writer.

The default prompt set is now built by :func:`companion.tiny_pair.chat_corpus.build_chat_prompts`
(held-out chat user turns); :func:`build_prompts` is the rule of the previous, code-only default,
kept for building code prompt sets.

Rule: in each held-out file (sorted order), a candidate starts at a line that opens a definition
(``def``, ``async def``, ``class``, at any indentation) and takes whole lines until it has at
least ``min_tokens`` tokens; it is rejected if that overshoots ``max_tokens`` or if the text is
not plain ASCII, contains a tab or an e-mail address. Candidates in one file never overlap. The
set then takes candidates round-robin across files (first of each file, then second, ...) so no
single long module dominates. The trailing newline is dropped, so the prompt ends on a natural
token boundary (the tokenizer merges a newline with the next line's indentation).
"""
from __future__ import annotations

import re
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from companion.prompts import Prompt, dumps_prompts
from companion.tiny_pair.corpus import SourceFile

_DEF_LINE = re.compile(r"^[ ]*(?:async[ ]+def|def|class)[ ]+\w")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def _acceptable(text: str) -> bool:
    return text.isascii() and "\t" not in text and not _EMAIL.search(text)


def file_candidates(
    f: SourceFile, tokenizer: PreTrainedTokenizerBase, min_tokens: int, max_tokens: int
) -> list[tuple[int, str, int]]:
    """Non-overlapping (start line, text, n_tokens) candidates of one file, in file order."""
    lines = f.text.split("\n")
    out: list[tuple[int, str, int]] = []
    i = 0
    while i < len(lines):
        if not _DEF_LINE.match(lines[i]):
            i += 1
            continue
        j = i
        text, n = "", 0
        while j < len(lines) and n < min_tokens:
            j += 1
            text = "\n".join(lines[i:j]).rstrip()
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if min_tokens <= n <= max_tokens and _acceptable(text):
            out.append((i + 1, text, n))
            i = j  # no overlap with the accepted candidate
        else:
            i += 1
    return out


def build_prompts(
    held_out: list[SourceFile],
    tokenizer: PreTrainedTokenizerBase,
    n_prompts: int,
    min_tokens: int,
    max_tokens: int,
) -> list[Prompt]:
    """``n_prompts`` prompts taken round-robin over the held-out files' candidates (fewer if they run out)."""
    per_file = [(f.relpath, file_candidates(f, tokenizer, min_tokens, max_tokens)) for f in held_out]
    chosen: list[Prompt] = []
    rank = 0
    while len(chosen) < n_prompts and any(rank < len(c) for _, c in per_file):
        for relpath, cands in per_file:
            if rank < len(cands) and len(chosen) < n_prompts:
                line, text, n = cands[rank]
                chosen.append(Prompt(f"default-{len(chosen):04d}", text, n, relpath, line))
        rank += 1
    return chosen


def write_prompts_jsonl(prompts: list[Prompt], path: Path) -> None:
    """Write the canonical JSONL serialisation (see :func:`companion.prompts.dumps_prompts`)."""
    path.write_bytes(dumps_prompts(prompts).encode("utf-8"))  # bytes: no newline translation

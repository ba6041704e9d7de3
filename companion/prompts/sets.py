"""Prompt sets: the project's chat requests, the closed-world pair's held-out prompts, or a file of your own.

Named sets: ``chat-requests`` (:mod:`companion.prompts.chat_requests`, SmolLM2's template; its held-out
requests first, in the seeded order whose first ``n`` are the default build's sample, then its
training split), ``chat-requests-train`` (the training split alone, which the drafter is built
from), ``stdlib-requests`` (:mod:`companion.prompts.stdlib_requests`: coding requests quoting the Python
standard library's documentation, in their seeded order), ``chat-and-stdlib`` (the two families
taken in turn: a chat request, a standard-library request, and so on, so that its first ``2n``
prompts are the first ``n`` of each) and ``default`` (the closed-world pair's held-out prompts).

A prompt file is either

* **JSONL** (``.jsonl``, ``.json`` or ``.ndjson``): one JSON object a line. ``text`` (a non-empty
  string) is required; ``prompt_id`` (default ``line-NNNNN``, the 1-based line number),
  ``n_tokens`` (length in the tokenizer the set was built for; default -1, unknown, which
  ``companion harvest`` fills in with its tokenizer), ``source`` (default: the file's name) and
  ``line`` (default: the line number) are optional; other fields are ignored; or
* **plain text** (any other name): one prompt a line, used as it is without its line break;
  blank lines are skipped; ids are ``line-NNNNN``.

The canonical serialisation (:func:`dumps_prompts`) is what the default file contains byte for
byte, so :func:`prompt_set_digest` equals that file's sha256.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from companion.assets import CHAT_REQUESTS_DIR, DEFAULT_PAIR_DIR, STDLIB_REQUESTS_DIR

PRESET_PROMPT_FILES: dict[str, Path] = {
    "default": DEFAULT_PAIR_DIR / "prompts.jsonl",
    "chat-requests": CHAT_REQUESTS_DIR / "prompts.jsonl",
    "chat-requests-train": CHAT_REQUESTS_DIR / "prompts.jsonl",
    "stdlib-requests": STDLIB_REQUESTS_DIR / "prompts.jsonl",
}
#: Named sets that take named sets in turn, one prompt of each at a time (until one runs out).
PRESET_PROMPT_MIXES: dict[str, tuple[str, ...]] = {"chat-and-stdlib": ("chat-requests", "stdlib-requests")}
#: Named sets that keep only some records of their file: name -> the ``source`` suffix kept.
PRESET_PROMPT_FILTERS: dict[str, str] = {"chat-requests-train": ":train"}
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
RECORD_FIELDS = "'text' (a non-empty string; optional: 'prompt_id', 'n_tokens', 'source', 'line')"


#: The paper's selection rule: at least this many prompt tokens once chat-templated.
MIN_TOKENS = 64


@dataclass(frozen=True)
class Prompt:
    """One prompt: id, text, its token count in the set's tokenizer (-1: unknown), and where it comes from."""

    prompt_id: str
    text: str
    n_tokens: int
    source: str
    line: int = 0


def dumps_prompts(prompts: list[Prompt]) -> str:
    """Canonical JSONL text of a prompt list (ASCII-escaped, fixed field order, one trailing newline per line)."""
    return "".join(json.dumps(asdict(p), ensure_ascii=True) + "\n" for p in prompts)


def prompt_set_digest(prompts: list[Prompt]) -> str:
    """sha256 (hex) of the canonical JSONL serialisation of ``prompts``: identifies a prompt set exactly."""
    return hashlib.sha256(dumps_prompts(prompts).encode("utf-8")).hexdigest()


def prompt_file(name_or_path: str | Path) -> Path:
    """The file of a prompt set: a preset's (``"default"``) or the path itself; ``FileNotFoundError`` if none."""
    key = str(name_or_path)
    path = PRESET_PROMPT_FILES.get(key, Path(name_or_path))
    if not path.is_file():
        known = ", ".join(sorted(PRESET_PROMPT_FILES | PRESET_PROMPT_MIXES))
        what = "a folder" if path.is_dir() else "not an existing file"
        raise FileNotFoundError(f"no prompt set {key!r}: not a preset ({known}) and {what}")
    return path


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    """``(line number, text without its line break)`` of every line, each decoded as UTF-8."""
    for n, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            yield n, raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{n}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                             "save the file as UTF-8") from None


def _int_field(obj: dict[str, Any], key: str, default: int, where: str) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: not a prompt record: {key!r} must be an integer, got {value!r}")
    return value


def _record(obj: Any, path: Path, n: int) -> Prompt:
    where = f"{path}:{n}"
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a prompt record: expected a JSON object with {RECORD_FIELDS}, "
                         f"got {type(obj).__name__}")
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        got = f"keys {sorted(obj)}" if "text" not in obj else f"'text' = {text!r}"
        raise ValueError(f"{where}: not a prompt record: needs {RECORD_FIELDS}, got {got}")
    pid = obj.get("prompt_id", f"line-{n:05d}")
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or pid == "":
        raise ValueError(f"{where}: not a prompt record: 'prompt_id' must be a non-empty string, got {pid!r}")
    source = obj.get("source", path.name)
    if not isinstance(source, str):
        raise ValueError(f"{where}: not a prompt record: 'source' must be a string, got {source!r}")
    return Prompt(str(pid), text, _int_field(obj, "n_tokens", -1, where), source, _int_field(obj, "line", n, where))


def load_prompts(name_or_path: str | Path = "default") -> list[Prompt]:
    """Load a prompt set: a name (see the module docstring) or a file.

    JSONL or plain text by the file's suffix (see the module docstring). Raises
    ``FileNotFoundError`` for a missing file and ``ValueError`` naming ``file:line`` for a line
    that is not UTF-8, not JSON, not a prompt record, or repeats an earlier ``prompt_id``.
    """
    mix = PRESET_PROMPT_MIXES.get(str(name_or_path))
    if mix is not None:
        families = [load_prompts(name) for name in mix]
        return [p for group in zip(*families) for p in group]
    path = prompt_file(name_or_path)
    prompts: list[Prompt] = []
    jsonl = path.suffix.lower() in JSONL_SUFFIXES
    first_line: dict[str, int] = {}
    for n, line in _lines(path):
        if not line.strip():
            continue
        if jsonl:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err.msg} at column {err.colno}); "
                                 f"each line must be one JSON object with {RECORD_FIELDS}") from None
            prompt = _record(obj, path, n)
        else:
            prompt = Prompt(f"line-{n:05d}", line, -1, path.name, n)
        if prompt.prompt_id in first_line:
            raise ValueError(f"{path}:{n}: duplicate prompt_id {prompt.prompt_id!r} "
                             f"(first on line {first_line[prompt.prompt_id]})")
        first_line[prompt.prompt_id] = n
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts (the file has no non-blank line)")
    keep = PRESET_PROMPT_FILTERS.get(str(name_or_path))
    return [p for p in prompts if p.source.endswith(keep)] if keep else prompts


def with_token_counts(prompts: list[Prompt], count: Callable[[str], int]) -> list[Prompt]:
    """``prompts`` with every unknown ``n_tokens`` (-1) set to ``count(text)``; known counts are kept."""
    return [replace(p, n_tokens=count(p.text)) if p.n_tokens < 0 else p for p in prompts]


def request_kind(prompt: Prompt) -> str | None:
    """The kind of request a prompt of the project's families is: a chat request's kind (``code``,
    ``advice``...), ``stdlib-<task>`` for a standard-library request (``stdlib-example``...); None
    for a prompt of any other source."""
    parts = prompt.source.split(":")
    if parts[0] == "chat-requests" and len(parts) >= 2:
        return parts[1]
    if parts[0] == "stdlib-requests" and len(parts) >= 3:
        return f"stdlib-{parts[2]}"
    return None


def templated(tokenizer: Any, text: str) -> str:
    """``text`` as one user turn in the tokenizer's chat template, with the generation prompt.

    The same call as the UltraChat presets' ``chat_prompt`` (SmolLM2's template adds its default
    system turn; models without thinking ignore ``enable_thinking``).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer must have a chat template (a chat model's tokenizer), got one without")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)


def templated_prompt(tokenizer: Any, request_id: str, text: str, source: str, line: int) -> Prompt:
    """A request's :class:`Prompt`: ``text`` in the tokenizer's chat template (:func:`templated`) and its
    token count. Raises ``ValueError`` naming ``request_id`` when it has under :data:`MIN_TOKENS` tokens
    (the paper's selection rule)."""
    prompt_text = templated(tokenizer, text)
    n_tokens = len(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    if n_tokens < MIN_TOKENS:
        raise ValueError(f"request {request_id} has {n_tokens} tokens once chat-templated; every request "
                         f"must have at least {MIN_TOKENS}")
    return Prompt(request_id, prompt_text, n_tokens, source, line)

"""Coding requests built from the Python standard library's own documentation: a prompt family no one here wrote.

**Why.** The paper samples UltraChat-200k, which no package registry serves, and the project's
chat requests (:mod:`companion.prompts.chat_requests`) are text this project wrote. This family's
substance is public text that every Python install carries: the docstrings of documented
standard-library functions (CPython's, under the Python Software Foundation License). Each
request quotes one function's documentation and asks for one of four small coding tasks about
it; only the task wording (one sentence of four kinds) is ours.

**How it was built, once.** :func:`build_requests` scanned the modules of :data:`MODULES` in the
Python that built the file (named in the file's ``about``) and the public methods of the types
of :data:`TYPES`, kept the public functions, classes and methods whose docstring has at least :data:`MIN_DOC_CHARS` characters, ranked them by
``sha256(f"stdlib:{module}.{name}")``, took at most :data:`PER_MODULE` per module (a type's
methods counting as a module of their own) in that order
until :data:`N_REQUESTS`, and gave the ``i``-th the task ``TASKS[i % 4]``. The documentation is
cut to whole paragraphs of at most :data:`MAX_DOC_CHARS` characters. The requests are data since:
``companion/assets/stdlib_requests/requests.json`` holds every request's id, module, function,
task and full text, so no Python version changes them; this module reads and checks it
(:func:`stdlib_requests`). ``python -m companion.prompts.stdlib_requests --rebuild`` rebuilds it from the
running Python (a different version gives different docstrings: a new family, to be committed on
purpose); ``--tokenizer DIR`` writes the prompt file in that tokenizer's chat template.

**The 64-token rule** of the paper's selection holds for every request in SmolLM2's and
Qwen2.5's templates (:func:`build_prompt_set` refuses shorter ones).

**How it differs from UltraChat.** Every request is a code task about a documented function,
with the documentation in the prompt: a narrower and more technical mix than UltraChat's first
turns (open questions, writing, advice, information seeking), and the answers are largely code.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import inspect
import json
import platform
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from companion import atomic
from companion.assets import STDLIB_REQUESTS_DIR
from companion.prompts.sets import Prompt, dumps_prompts, templated_prompt

#: The modules scanned, in this order (pure functions with documentation a short example can use).
MODULES: tuple[str, ...] = (
    "base64", "bisect", "calendar", "collections", "colorsys", "copy", "csv", "datetime", "difflib", "fnmatch",
    "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "inspect", "ipaddress", "itertools",
    "json", "keyword", "math", "operator", "os", "os.path", "pathlib", "pprint", "random", "re", "secrets",
    "shlex", "shutil", "statistics", "string", "struct", "tempfile", "textwrap", "time", "unicodedata",
    "urllib.parse", "uuid", "zlib",
)
#: Types whose public methods are scanned as well (module, type name); ``builtins`` ones are named bare.
TYPES: tuple[tuple[str, str], ...] = (
    ("builtins", "str"), ("builtins", "bytes"), ("builtins", "list"), ("builtins", "dict"), ("builtins", "set"),
    ("builtins", "int"), ("builtins", "float"), ("collections", "Counter"), ("collections", "deque"),
    ("datetime", "date"), ("datetime", "datetime"), ("fractions", "Fraction"), ("pathlib", "PurePath"),
    ("pathlib", "Path"), ("textwrap", "TextWrapper"), ("difflib", "SequenceMatcher"),
)
#: The tasks, our words; ``{name}`` is the function's qualified name.
TASKS: tuple[tuple[str, str], ...] = (
    ("example", "Could you write a short, runnable example that uses `{name}`, and say in a sentence or two what "
                "it prints?"),
    ("explain", "Could you explain in plain words what `{name}` does, and name one mistake people make with it?"),
    ("test", "Could you write a small pytest test for `{name}` that checks one behaviour this documentation "
             "describes?"),
    ("wrap", "Could you show how I would call `{name}` inside a small function of my own, with a docstring and "
             "type hints?"),
)
OPENING = "I'm reading the documentation of `{name}` in Python's standard library:"
N_REQUESTS = 300
PER_MODULE = 12
MIN_DOC_CHARS = 100
MAX_DOC_CHARS = 700
SOURCE_PREFIX = "stdlib-requests"
REQUESTS_FILE: Path = STDLIB_REQUESTS_DIR / "requests.json"
ASSET_FILE: Path = STDLIB_REQUESTS_DIR / "prompts.jsonl"
_KEYS = ("id", "module", "function", "task", "text")


@dataclass(frozen=True)
class StdlibRequest:
    """One request: id ``stdlib-NNNN-<task>``, the function it quotes, the task, and the full user text."""

    request_id: str
    module: str
    function: str
    task: str
    text: str


class RequestsFileError(ValueError):
    """``requests.json`` is not what :func:`stdlib_requests` expects: one line naming the entry."""


@functools.lru_cache(maxsize=4)
def _read(path: Path) -> tuple[dict[str, Any], tuple[StdlibRequest, ...]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestsFileError(f"{path}: not a readable JSON file ({err})") from None
    if not (isinstance(data, dict) and isinstance(data.get("about"), dict) and isinstance(data.get("requests"), list)):
        raise RequestsFileError(f"{path}: expected an object with 'about' (an object) and 'requests' (a list)")
    tasks = {t for t, _ in TASKS}
    out: list[StdlibRequest] = []
    seen: set[str] = set()
    for i, row in enumerate(data["requests"], 1):
        if not (isinstance(row, dict) and set(row) == set(_KEYS) and all(isinstance(row[k], str) for k in _KEYS)):
            raise RequestsFileError(f"{path}: request {i} must have the text fields {', '.join(_KEYS)} and no others")
        r = StdlibRequest(row["id"], row["module"], row["function"], row["task"], row["text"])
        name = qualified_name(r.module, r.function)
        if r.task not in tasks or r.request_id != f"stdlib-{i:04d}-{r.task}":
            raise RequestsFileError(f"{path}: request {i}: id {r.request_id!r} or task {r.task!r} out of order "
                                    f"(expected stdlib-{i:04d}-<task>, task one of {', '.join(sorted(tasks))})")
        if r.text != r.text.strip() or f"`{name}`" not in r.text or name in seen:
            raise RequestsFileError(f"{path}: {r.request_id}: text unstripped, not naming `{name}`, or a function "
                                    "quoted twice")
        seen.add(name)
        out.append(r)
    return data["about"], tuple(out)


def stdlib_requests(path: Path = REQUESTS_FILE) -> list[StdlibRequest]:
    """Every request of the committed file, in its order (the seeded order of the build), checked.

    Raises :class:`RequestsFileError` (one line) when the file is unreadable or breaks a rule: ids
    ``stdlib-0001-<task>`` upwards, a known task, texts stripped and naming their function, no
    function twice.
    """
    return list(_read(Path(path))[1])


def about(path: Path = REQUESTS_FILE) -> dict[str, Any]:
    """The file's provenance: the Python that built it, the license of the quoted text, the rules."""
    return dict(_read(Path(path))[0])


# -------------------------------------------------------------------------------------------------
# Building the file from the running Python (done once; the committed file is the family)


def _doc_excerpt(doc: str) -> str:
    """Whole paragraphs of ``doc`` from the first, up to :data:`MAX_DOC_CHARS` characters (at least the first)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]
    kept = [paragraphs[0]]
    for p in paragraphs[1:]:
        if len("\n\n".join(kept + [p])) > MAX_DOC_CHARS:
            break
        kept.append(p)
    return "\n\n".join(kept)


def qualified_name(module: str, function: str) -> str:
    """How a request names its function: ``module.function``, builtins bare (``str.split``)."""
    return function if module == "builtins" else f"{module}.{function}"


def _signature(name: str, obj: Any) -> str:
    try:
        signature = f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):  # some C functions carry no signature; their docstring's first line names it
        return ""
    # a default that is a function or method prints with its memory address, which differs from run to run
    signature = re.sub(r"<function (\S+) at 0x[0-9a-f]+>", r"\1", signature)
    return re.sub(r" at 0x[0-9a-f]+>", ">", signature)


def _entry(module: str, function: str, obj: Any) -> tuple[str, str, str] | None:
    """``(module, function, documentation block)`` when ``obj`` has enough documentation of its own."""
    doc = inspect.getdoc(obj) or ""
    if len(doc) < MIN_DOC_CHARS:
        return None
    name = qualified_name(module, function)
    signature = _signature(name, obj)
    block = _doc_excerpt(doc)
    return module, function, f"{signature}\n\n{block}" if signature else block


def candidates() -> list[tuple[str, str, str]]:
    """``(module, function, documentation block)`` of every public documented function and class of
    :data:`MODULES` and every public documented method of :data:`TYPES`."""
    out = []
    for module in MODULES:
        mod = importlib.import_module(module)
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            home = getattr(obj, "__module__", None)
            if home not in (mod.__name__, module, None) and module not in ("os", "os.path"):
                continue  # re-exported from elsewhere: documented under its own module
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                continue
            entry = _entry(module, name, obj)
            if entry is not None:
                out.append(entry)
    for module, type_name in TYPES:
        cls = getattr(importlib.import_module(module), type_name)
        for name, obj in sorted(vars(cls).items()):
            if name.startswith("_") or not callable(obj if not isinstance(obj, (classmethod, staticmethod))
                                                    else obj.__func__):
                continue
            entry = _entry(module, f"{type_name}.{name}", getattr(cls, name))
            if entry is not None:
                out.append(entry)
    return out


def build_requests(n: int = N_REQUESTS) -> list[StdlibRequest]:
    """The family's ``n`` requests from the running Python, by the rules of the module docstring."""
    ranked = sorted(candidates(), key=lambda c: hashlib.sha256(f"stdlib:{c[0]}.{c[1]}".encode()).hexdigest())
    per_module: dict[str, int] = {}
    chosen: list[StdlibRequest] = []
    for module, name, block in ranked:
        home = f"{module}.{name.split('.')[0]}" if "." in name else module  # a type's methods count as their own
        if per_module.get(home, 0) >= PER_MODULE:
            continue
        per_module[home] = per_module.get(home, 0) + 1
        task, ask = TASKS[len(chosen) % len(TASKS)]
        qualified = qualified_name(module, name)
        text = f"{OPENING.format(name=qualified)}\n\n```\n{block}\n```\n\n{ask.format(name=qualified)}"
        chosen.append(StdlibRequest(f"stdlib-{len(chosen) + 1:04d}-{task}", module, name, task, text))
        if len(chosen) == n:
            return chosen
    raise ValueError(f"only {len(chosen)} documented functions qualify; {n} were asked for")


def requests_document(requests: Sequence[StdlibRequest]) -> dict[str, Any]:
    """The JSON document of the committed file: provenance and every request."""
    return {
        "about": {
            "source": "docstrings of the Python standard library's public functions (inspect.getdoc)",
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "license": "Python Software Foundation License Version 2 (the quoted documentation); the task "
                       "sentences are this project's",
            "modules": list(MODULES), "per_module": PER_MODULE, "min_doc_chars": MIN_DOC_CHARS,
            "max_doc_chars": MAX_DOC_CHARS, "rank": "sha256('stdlib:' + module + '.' + function)",
            "tasks": {t: ask for t, ask in TASKS}, "opening": OPENING,
        },
        "requests": [{"id": r.request_id, "module": r.module, "function": r.function, "task": r.task,
                      "text": r.text} for r in requests],
    }


def build_prompt_set(tokenizer: Any, requests: Sequence[StdlibRequest]) -> list[Prompt]:
    """The prompts of ``requests`` in the tokenizer's chat template (``source`` = family, module and task)."""
    return [templated_prompt(tokenizer, r.request_id, r.text, f"{SOURCE_PREFIX}:{r.module}:{r.task}", i)
            for i, r in enumerate(requests)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.prompts.stdlib_requests [--rebuild] --tokenizer DIR``: write the family's files."""
    parser = argparse.ArgumentParser(prog="python -m companion.prompts.stdlib_requests",
                                     description="Write the standard-library request family's prompt file (and, "
                                                 "with --rebuild, its requests from the running Python).")
    parser.add_argument("--tokenizer", required=True, type=Path, help="folder of a saved chat tokenizer")
    parser.add_argument("--rebuild", action="store_true",
                        help=f"rebuild {REQUESTS_FILE.name} from this Python's standard library first")
    args = parser.parse_args(argv)
    if not args.tokenizer.is_dir():
        print(f"error: --tokenizer must be a folder holding a saved tokenizer, got {str(args.tokenizer)!r}",
              file=sys.stderr)
        return 2
    from transformers import AutoTokenizer  # heavy; only the command needs it

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.rebuild:
        document = requests_document(build_requests())
        atomic.write_text(REQUESTS_FILE, json.dumps(document, indent=1, ensure_ascii=False) + "\n")
        _read.cache_clear()
    try:
        prompts = build_prompt_set(tokenizer, stdlib_requests())
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    atomic.write_text(ASSET_FILE, dumps_prompts(prompts))
    lengths = [p.n_tokens for p in prompts]
    print(f"wrote {ASSET_FILE}: {len(prompts)} prompts, templated tokens min {min(lengths)}, "
          f"median {statistics.median(lengths):g}, max {max(lengths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

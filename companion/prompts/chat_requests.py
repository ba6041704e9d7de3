"""Chat requests written for this project: a prompt set in the shape of the paper's UltraChat sample.

**What it is.** The paper measured its targets on 500 random UltraChat-200k first turns with at
least 64 prompt tokens once chat-templated, decoding 128 greedy steps each. UltraChat cannot be
downloaded where this companion is built, so this module *writes* a set of ordinary chat
requests in that shape: what people ask a chat assistant, each with some context and a
constraint or two, as users write them ("I'm preparing ... Could you ..."). It is not a closed
world: requests are open-ended, the answers are the model's own.

**How it was written.** By this project's authors, by hand: for each kind of request a short
list of items (topics, situations, questions, code tasks, role-play setups, twenty short
passages of our own for the passage-based kinds) and a few phrasings and constraints; every
request is an item in one of its phrasings, each item used about equally (a seeded generator
expanded the phrasings once; it lived in this module until the set was frozen as data, see
``git log -- companion/prompts/chat_requests.py``). The requests are data now:
``companion/assets/chat_requests/requests.json`` lists every request (id, kind, group, text) in
the set's order and the shared passages; this module reads it, checks it
(:func:`chat_requests`: ids ``chat-NNNN-<kind>`` in order, known kinds, unique and stripped texts,
every passage request holding its passage) and splits it. Change a request there, then rebuild
the prompt file (below).

============== ===== ========================================================================
kind           count what
============== ===== ========================================================================
writing           60 poems, stories, emails and letters, speeches and toasts, descriptions, blog posts
open-question     60 opinion and "why" questions with no single answer
explanation       60 how something works, in plain language
advice            60 a personal or work situation and a question about it
arithmetic        60 word problems with seeded numbers (shopping, travel, recipes, rates, ages)
code              60 small functions in four languages; SQL, shell, regex, debugging, tests
summarise         60 summarise a passage given in the prompt
extract           60 pull dates, numbers, names or facts out of a passage given in the prompt
translation       60 short messages into six languages, and five messages into English
rewriting         60 simplify, shorten, restyle or correct a passage or a draft given in the prompt
roleplay          60 a role-play setup (interview practice, language practice, fiction)
============== ===== ========================================================================

660 requests in all, no two identical.

**The split.** Requests that share an *item* (the same passage, topic, code task, setup or
word-problem template, phrased differently) are a *group*, and a group lies wholly on one side:
otherwise a held-out request would differ from a training one only in its wording, which is
the leak the closed-world pair's held-out prompts had. Groups form pools: the shared passages
(used by summarise, extract and rewriting) are one pool, and each kind's other items are a pool
of their own. Within a pool, groups are ranked by ``sha256(f"split:{group}")`` and the first
half (rounded up) is ``"heldout"``, the rest ``"train"``: every kind has both, and about half of
its requests are held out (see the tests). **No drafter training may read a held-out request.**

**The 64-token rule.** A request's prompt is its text as one user turn in the target
tokenizer's chat template with the generation prompt (SmolLM2's template adds its default
system turn); :func:`build_prompt_set` refuses any request under 64 tokens there, as the paper's
selection did. In SmolLM2's template the requests have 70 to 174 tokens, median 100 (30 of them are
the template's own, 21 of those its system turn); the passage kinds are the longest. The committed ``prompts.jsonl`` (``companion.assets.CHAT_REQUESTS_DIR``) holds
every request of both splits in SmolLM2-135M-Instruct's template, ``source`` =
``chat-requests:<kind>:<split>``; rebuild it from ``requests.json`` with
``python -m companion.prompts.chat_requests --tokenizer DIR``.

**The default build** takes :func:`default_subset` of the held-out split: a fixed, seeded sample
spread over the kinds. The committed file lists the held-out requests first, in that order, then
the training split (:func:`asset_order`), so the first ``n`` prompts are that sample; the prompt
set ``chat-requests-train`` (:mod:`companion.prompts.sets`) is the training split alone.

**Comparability.** This is this project's own text, not UltraChat. Results on it are
comparable to the paper's in shape (chat requests of the same length class, templated the same
way, decoded the same number of greedy steps), not in content: how concentrated a model's next
tokens are depends on what is asked, and our mix of kinds is our choice.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from companion import atomic
from companion.assets import CHAT_REQUESTS_DIR
from companion.prompts.sets import MIN_TOKENS, Prompt, dumps_prompts, templated, templated_prompt

#: The kinds of request, in the order the set lists them.
KINDS: tuple[str, ...] = ("writing", "open-question", "explanation", "advice", "arithmetic", "code",
                          "summarise", "extract", "translation", "rewriting", "roleplay")
#: Requests written per kind.
PER_KIND = 60
# The requests as data: kinds, shared passages, and every request (id, kind, group, text) in order.
REQUESTS_FILE: Path = CHAT_REQUESTS_DIR / "requests.json"
# The committed prompt file (every request, both splits, SmolLM2's template).
ASSET_FILE: Path = CHAT_REQUESTS_DIR / "prompts.jsonl"
SPLITS = ("train", "heldout")
SOURCE_PREFIX = "chat-requests"
PASSAGE_POOL = "passage"
_REQUEST_KEYS = ("id", "kind", "group", "text")


@dataclass(frozen=True)


class ChatRequest:
    """One user request: stable id, kind, the user's text, its split, and its item group."""

    request_id: str
    kind: str
    text: str
    split: str
    group: str


class RequestsFileError(ValueError):
    """``requests.json`` is not what :func:`read_requests_file` expects: one line naming the entry."""


def _check(ok: bool, path: Path, what: str) -> None:
    if not ok:
        raise RequestsFileError(f"{path}: {what}")


@functools.lru_cache(maxsize=4)


def read_requests_file(path: Path = REQUESTS_FILE) -> tuple[tuple[str, ...], tuple[tuple[str, str, str, str], ...]]:
    """``(passages, requests)`` of a requests file, every request as ``(id, kind, group, text)``, checked.

    Raises :class:`RequestsFileError` (one line) for a file that is not JSON or breaks a rule: the
    kinds are :data:`KINDS`; ids run ``chat-0001-<kind>`` upwards in order; texts are unique,
    stripped and non-empty; a group is ``<kind>-NN`` or ``passage-NN`` (summarise, extract,
    rewriting only), and a passage request holds that passage word for word.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestsFileError(f"{path}: not a readable JSON file ({err})") from None
    _check(isinstance(data, dict) and isinstance(data.get("requests"), list) and isinstance(data.get("passages"), list),
           path, "expected an object with lists 'passages' and 'requests'")
    _check(isinstance(data.get("kinds"), list) and tuple(data["kinds"]) == KINDS, path, f"kinds must be {', '.join(KINDS)}")
    passages = tuple(data["passages"])
    _check(all(isinstance(p, str) and p.strip() == p != "" for p in passages), path, "passages must be stripped texts")
    rows: list[tuple[str, str, str, str]] = []
    seen: set[str] = set()
    for i, row in enumerate(data["requests"], 1):
        where = f"request {i}"
        _check(isinstance(row, dict) and set(row) == set(_REQUEST_KEYS) and all(isinstance(row[k], str) for k in row),
               path, f"{where} must have the text fields {', '.join(_REQUEST_KEYS)} and no others")
        rid, kind, group, text = (row[k] for k in _REQUEST_KEYS)
        _check(kind in KINDS and rid == f"chat-{i:04d}-{kind}", path, f"{where}: id {rid!r} or kind {kind!r} out of "
               f"order (expected chat-{i:04d}-<kind>, kind one of {', '.join(KINDS)})")
        _check(text == text.strip() != "" and text not in seen, path, f"{rid}: text empty, unstripped or repeated")
        seen.add(text)
        m = re.fullmatch(r"(.+)-(\d\d)", group)
        _check(m is not None and m.group(1) in (kind, PASSAGE_POOL), path, f"{rid}: group {group!r} is not "
               f"{kind}-NN or {PASSAGE_POOL}-NN")
        if m is not None and m.group(1) == PASSAGE_POOL:
            n = int(m.group(2))
            _check(kind in ("summarise", "extract", "rewriting") and n < len(passages) and passages[n] in text,
                   path, f"{rid}: group {group!r} names no passage this request holds")
        rows.append((rid, kind, group, text))
    return passages, tuple(rows)


#: Passages of our own (2-5 sentences, each with people or organisations and numbers or dates),
#: shared by the summarise, extract and rewriting kinds; names in them are invented.
PASSAGES: tuple[str, ...] = read_requests_file()[0]


def _pool(group: str) -> str:
    """The split pool of a group: ``"passage"`` for the shared passages, else the kind's own items."""
    return group.rsplit("-", 1)[0]


def group_splits(groups: set[str]) -> dict[str, str]:
    """The split of every group: per pool, ranked by ``sha256(f"split:{group}")``, first half (rounded up) held out."""
    pools: dict[str, list[str]] = {}
    for g in groups:
        pools.setdefault(_pool(g), []).append(g)
    split: dict[str, str] = {}
    for members in pools.values():
        ranked = sorted(members, key=lambda g: hashlib.sha256(f"split:{g}".encode()).hexdigest())
        n_held = (len(ranked) + 1) // 2
        split.update({g: "heldout" if i < n_held else "train" for i, g in enumerate(ranked)})
    return split


def chat_requests(path: Path = REQUESTS_FILE) -> list[ChatRequest]:
    """Every request, in the file's order (kind by kind, :data:`KINDS`), ids ``chat-NNNN-<kind>`` from 1,
    each with its split (:func:`group_splits`). The same list on every call; texts are unique."""
    _, rows = read_requests_file(Path(path))
    split = group_splits({group for _, _, group, _ in rows})
    return [ChatRequest(rid, kind, text, split[group], group) for rid, kind, group, text in rows]


def sample_key(seed: int, request_id: str) -> str:
    """A request's rank in the seeded random order, ``sha256(f"{seed}:{request_id}")``.

    The same rule as the UltraChat presets' ``companion.prompts.ultrachat.sample_key`` (not imported:
    the presets will import this module).
    """
    return hashlib.sha256(f"{seed}:{request_id}".encode()).hexdigest()


def default_subset(requests: Sequence[ChatRequest], n: int, seed: int = 0) -> list[ChatRequest]:
    """A fixed, seeded sample of ``n`` held-out requests, spread across the kinds.

    Each kind's held-out requests are ranked by :func:`sample_key`; the kinds are ordered by
    their best-ranked request; then round-robin over the kinds, each turn taking that kind's
    best-ranked request whose group (passage, topic, template) is not yet in the sample, or its
    best-ranked one if every group is. So the first ``len(kinds)`` requests cover every kind,
    and small samples repeat no passage or topic while they can avoid it.
    """
    held = [r for r in requests if r.split == "heldout"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(held):
        raise ValueError(f"n must be an integer from 1 to {len(held)} (the held-out requests given), got {n!r}")
    queues: dict[str, list[ChatRequest]] = {}
    for r in sorted(held, key=lambda r: sample_key(seed, r.request_id)):
        queues.setdefault(r.kind, []).append(r)
    order = sorted(queues, key=lambda k: sample_key(seed, queues[k][0].request_id))
    chosen: list[ChatRequest] = []
    used: set[str] = set()
    while len(chosen) < n:
        for kind in order:
            queue = queues[kind]
            if not queue or len(chosen) == n:
                continue
            pick = next((r for r in queue if r.group not in used), queue[0])
            queue.remove(pick)
            chosen.append(pick)
            used.add(pick.group)
    return chosen


# ---------------------------------------------------------------------------------------------
# Templating and the committed asset
# ---------------------------------------------------------------------------------------------


def build_prompt_set(tokenizer: Any, requests: Sequence[ChatRequest]) -> list[Prompt]:
    """The prompts of ``requests`` in order: templated text, its token count, ``source`` = kind and split.

    ``n_tokens = len(tokenizer(text, add_special_tokens=False).input_ids)`` (the template already
    holds the special tokens). Raises ``ValueError`` naming the first request under
    :data:`MIN_TOKENS` tokens; nothing is returned then.
    """
    return [templated_prompt(tokenizer, r.request_id, r.text, f"{SOURCE_PREFIX}:{r.kind}:{r.split}", i)
            for i, r in enumerate(requests)]


def asset_order(requests: Sequence[ChatRequest], seed: int = 0) -> list[ChatRequest]:
    """The committed file's order: every held-out request in :func:`default_subset` order, then the
    training split in the set's order. So the first ``n`` prompts of the file are the default
    build's seeded held-out sample of ``n``, whatever ``n`` up to the held-out count, and a larger
    run (the full profile's 500) adds the training split's requests only past the held-out ones."""
    held = sum(r.split == "heldout" for r in requests)
    return default_subset(requests, held, seed) + [r for r in requests if r.split == "train"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.prompts.chat_requests --tokenizer DIR [--out FILE]``: write the canonical prompt file."""
    parser = argparse.ArgumentParser(prog="python -m companion.prompts.chat_requests",
                                     description="Template every chat request with a tokenizer and write the "
                                                 "canonical prompt JSONL (both splits).")
    parser.add_argument("--tokenizer", required=True, type=Path, help="folder of a saved chat tokenizer")
    parser.add_argument("--out", type=Path, default=ASSET_FILE, help=f"output file (default: {ASSET_FILE})")
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    if not args.tokenizer.is_dir():
        return fail(f"--tokenizer must be a folder holding a saved tokenizer, got {str(args.tokenizer)!r} "
                    "(not a folder)")
    if not args.out.parent.is_dir():
        return fail(f"--out must be a file in an existing folder, got {str(args.out)!r} (no folder "
                    f"{str(args.out.parent)!r})")
    from transformers import AutoTokenizer  # heavy; only the command needs it

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        first = first if len(first) <= 160 else first[:157] + "..."  # transformers lists every model type
        return fail(f"--tokenizer must be a folder holding a saved tokenizer, got {str(args.tokenizer)!r} ({first})")
    try:
        prompts = build_prompt_set(tokenizer, asset_order(chat_requests()))  # RequestsFileError is a ValueError
    except ValueError as err:
        return fail(str(err))
    atomic.write_text(args.out, dumps_prompts(prompts))
    lengths = [p.n_tokens for p in prompts]
    held = sum(p.source.endswith(":heldout") for p in prompts)
    print(f"wrote {args.out}: {len(prompts)} prompts ({held} held out), templated tokens min {min(lengths)}, "
          f"median {statistics.median(lengths):g}, max {max(lengths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Prompts on which the embedded pair writes long greedy texts, for the tests of the decoders.

The pair's chat answers are short (a few tokens, then its end-of-turn token): too short for the
multi-round speculative runs those tests compare. The pair also continues Python source, which
makes up part of its training windows, for as long as it is asked: the openings of the held-out
standard-library files (never trained on) are such prompts. Its chat prompts are the ones whose
greedy text ends with the end-of-turn token.
"""
from __future__ import annotations

from companion.prompts.sets import load_prompts
from companion.models.tiny_pair import corpus as corpus_mod


def code_prompts(n: int, chars: int = 240) -> list[str]:
    """The first ``chars`` characters of the first ``n`` plain-ASCII held-out standard-library files."""
    _, held = corpus_mod.split_corpus(corpus_mod.load_corpus(None))
    texts = [f.text[:chars] for f in held if len(f.text) >= chars and f.text[:chars].isascii()]
    if len(texts) < n:
        raise ValueError(f"only {len(texts)} held-out files have {chars} plain characters; {n} were asked for")
    return texts[:n]


def chat_prompts(n: int) -> list[str]:
    """The first ``n`` prompts of the pair's own prompt set (chat requests; short answers)."""
    return [p.text for p in load_prompts("default")[:n]]

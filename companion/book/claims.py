"""Guards for the claims that a chapter's hand-written prose makes.

The prose of a chapter is written by hand in its markdown cells; code computes and glues numbers
and never assembles sentences. Every sentence that states something the data could contradict
("the tree of width 8 certifies more steps than strict greedy") has a check in the code cell
beside it::

    claims = Claims("07")
    claims.check("tree8 above greedy", tree8_median > greedy_median,
                 "the width-8 tree's median certificate is above strict greedy's",
                 tree8_median=tree8_median, greedy_median=greedy_median)

What a failing check does depends on who runs the chapter:

* ``strict`` (the book's own build: ``companion reproduce`` on a profile whose ``claims`` key is
  ``strict``, which sets ``COMPANION_CLAIMS=strict`` for the kernel): it raises ``AssertionError``
  naming the claim and its numbers, so the build fails when the data stop supporting a sentence.
* ``note`` (everything else: a reader's rerun on other models, the test profile at small sizes, a
  notebook opened in Jupyter): the cell shows a visible warning naming the sentence that does not
  hold for this run, with the numbers, and :meth:`Claims.summary` lists every such sentence.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

ENV = "COMPANION_CLAIMS"
MODES = ("strict", "note")


def claims_mode(default: str = "note") -> str:
    """The mode for this process: ``$COMPANION_CLAIMS`` if set (``strict`` or ``note``), else ``default``."""
    mode = os.environ.get(ENV, "").strip() or default
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _value(x: Any) -> str:
    """A number as a reader wants it in a message: 4 significant digits, integers whole."""
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:.4g}"
    return repr(x)


@dataclass
class Failed:
    """A claim that the data of this run do not support."""

    name: str
    statement: str
    numbers: dict[str, Any]

    def message(self) -> str:
        """One line: the claim's name and statement, and the numbers it rests on."""
        shown = ", ".join(f"{k} = {_value(v)}" for k, v in self.numbers.items())
        return f"claim {self.name!r} does not hold for this run: {self.statement}" + (f" ({shown})" if shown else "")


@dataclass
class Claims:
    """The claims of one chapter: :meth:`check` each, :meth:`summary` at the end.

    ``mode``: ``"strict"`` or ``"note"``; None reads ``$COMPANION_CLAIMS`` (default ``note``).
    ``show``: how a note is displayed (default: a Markdown warning box under the cell).
    """

    chapter: str
    mode: str | None = None
    show: Callable[[str], None] | None = None
    checked: list[str] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mode = claims_mode() if self.mode is None else self.mode
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: expected one of {', '.join(MODES)}")

    def check(self, name: str, holds: Any, statement: str, **numbers: Any) -> bool:
        """Check one claim; return whether it holds.

        ``holds``: a truth value (a numpy or torch boolean scalar is fine); ``statement``: the claim
        as the prose makes it; ``numbers``: the values it rests on, shown when it fails.
        """
        if name in self.checked:
            raise ValueError(f"chapter {self.chapter}: claim {name!r} is checked twice; give each claim its own name")
        self.checked.append(name)
        ok = bool(holds.item() if hasattr(holds, "item") else holds)
        if ok:
            return True
        failed = Failed(name, statement, dict(numbers))
        self.failed.append(failed)
        if self.mode == "strict":
            raise AssertionError(f"chapter {self.chapter}: {failed.message()}")
        self._display(failed.message())
        return False

    def _glue_failed(self) -> None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        if get_ipython() is None:
            return
        from myst_nb import glue

        glue("claims_failed", [f.name for f in self.failed], display=False)

    def _display(self, text: str) -> None:
        if self.show is not None:
            self.show(text)
            return
        try:
            from IPython.display import Markdown, display
        except ImportError:  # outside IPython: plain text
            print(f"Note: {text}")
            return
        display(Markdown(f"```{{warning}}\n{text}. The sentence beside this cell was written for the "
                         "book's own run; read it against the numbers above.\n```"))

    def summary(self) -> str:
        """Markdown: how many claims were checked, and each that does not hold for this run.

        In a notebook it also glues the names of the failed claims as ``claims_failed``, so that a
        page quoting this chapter (:mod:`companion.book.measured`) knows which sentences hold.
        """
        self._glue_failed()
        n = len(self.checked)
        if not self.failed:
            return f"All {n} claims this chapter's prose makes hold for this run."
        lines = [f"{len(self.failed)} of the {n} claims this chapter's prose makes do not hold for this run "
                 "(the prose was written for the book's own run):", ""]
        lines += [f"- {f.message()}" for f in self.failed]
        return "\n".join(lines)

"""The one error of the weights layer: something could not be fetched, checked, converted or loaded."""
from __future__ import annotations


class WeightsUnavailableError(OSError):
    """A model or tokenizer cannot be had here; the message is one line that says what to do.

    Raised by the package-index loader (:mod:`companion.models.weights.fetch`,
    :mod:`companion.models.weights.convert`) and by :func:`companion.models.loading.load_pair`; the command-line
    tools print it after ``error:`` and exit with status 2.
    """


def one_line(err: BaseException) -> str:
    """An exception's message on one line (its type when it has none)."""
    return " ".join(str(err).split()) or type(err).__name__

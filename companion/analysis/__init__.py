"""Statistics on harvested traces: :mod:`companion.analysis.traces` and the size axis,
:mod:`companion.analysis.size_axis`.

``from companion import analysis as A`` gives the names of :mod:`companion.analysis.traces`
(``A.Traces``, ``A.target_summary``, ...); the size axis is a module of its own
(``from companion.analysis import size_axis``).
"""
# traces' own __all__ is the one list of these names (a name added there is exported here too)
from companion.analysis.traces import *  # noqa: F401,F403
from companion.analysis.traces import __all__  # noqa: F401

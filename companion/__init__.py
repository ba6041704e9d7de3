"""Companion library to *When Is a Draft Accepted? A Theory of Acceptance in Speculative Decoding*.

The certificate engine (criteria, exact KL certificates, witnesses, tree certificates) is
importable from the top level; bounds, certified runs and the stochastic contrast live in
``companion.bounds``, ``companion.runs`` and ``companion.stochastic``.
"""
from companion.certificates import (
    certificate,
    certificates,
    kl_divergence,
    per_token_cost,
    tree_certificate,
    tree_witness,
    witness,
)
from companion.criteria import (
    PAPER_CRITERIA,
    AdditiveRelaxed,
    Criterion,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    parse_criteria,
    parse_criterion,
)

__version__ = "0.1.0"

__all__ = [
    "AdditiveRelaxed",
    "Criterion",
    "MultiplicativeRelaxed",
    "PAPER_CRITERIA",
    "StrictGreedy",
    "TopKDelta",
    "TopM",
    "Typical",
    "certificate",
    "certificates",
    "kl_divergence",
    "parse_criteria",
    "parse_criterion",
    "per_token_cost",
    "tree_certificate",
    "tree_witness",
    "witness",
]

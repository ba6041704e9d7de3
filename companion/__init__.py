"""Companion library to *When Is a Draft Accepted? A Theory of Acceptance in Speculative Decoding*
(arXiv:2606.30265, https://arxiv.org/abs/2606.30265).

The certificate engine (criteria, exact KL certificates, witnesses, tree certificates), the
per-criterion verdict on a drafter (:func:`certified`) and certificates from a server's top-k
logprobs (:func:`certificates_from_logprobs`) are importable from the top level. Certificates
are the worst case over tie-breaks by default (``ties="worst"``, sound for every decoder that
breaks exact ties in a fixed way, as ``argmax`` does; :data:`TIES`); bounds,
certified runs and the stochastic contrast live in ``companion.certify.bounds``, ``companion.certify.runs`` and
``companion.certify.stochastic``.
"""
from companion.certify.certificates import (
    certificate,
    certificates,
    kl_divergence,
    per_token_cost,
    tree_certificate,
    tree_witness,
    witness,
)
from companion.certify.criteria import (
    PAPER_CRITERIA,
    TIES,
    AdditiveRelaxed,
    Criterion,
    Mars,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    parse_criteria,
    parse_criterion,
)
from companion.certify.server_logprobs import LogprobCertificate, certificates_from_logprobs
from companion.certify.verdicts import Certification, Certifications, certified

__version__ = "0.1.0"

__all__ = [
    "AdditiveRelaxed",
    "Certification",
    "Certifications",
    "Criterion",
    "LogprobCertificate",
    "Mars",
    "MultiplicativeRelaxed",
    "PAPER_CRITERIA",
    "StrictGreedy",
    "TIES",
    "TopKDelta",
    "TopM",
    "Typical",
    "certificate",
    "certificates",
    "certificates_from_logprobs",
    "certified",
    "kl_divergence",
    "parse_criteria",
    "parse_criterion",
    "per_token_cost",
    "tree_certificate",
    "tree_witness",
    "witness",
]

"""Is this drafter certified? Per criterion, for a target ``p`` and a drafter ``q`` side by side.

For each criterion ``c`` and each row (a decoding step), with ``d = argmax q`` the drafter's
greedy token and ``D`` the chosen divergence (``"forward"``: ``KL(p || q)``, ``"reverse"``:
``KL(q || p)``):

* ``accepted``: a real decoder accepts ``d`` under ``c``
  (:meth:`~companion.certify.criteria.Criterion.decoder_accepts`): ``p_d >= tau_c(p)`` (``>`` for typical
  acceptance) and, for the rank conditions, the decoders' own rule on the tensors as given, first
  index wins: strict greedy accepts ``d`` iff ``d == torch.argmax(p)``, ``topm:M`` iff ``d`` is in
  the id-ordered ``topk(p, M)``, ``topk-delta:K,D`` iff in ``topk(p, K)`` as well;
* ``certificate``: ``rho*_c(p) = inf { D(p, q') : argmax q' is rejected by c }``, from
  :func:`companion.certify.certificates.certificates`, under the worst case over tie-breaks
  (``ties="worst"``, the default; ``"level-set"`` for analysis);
* ``kl``: ``D(p, q)``, from :func:`companion.certify.certificates.kl_divergence`;
* ``certified``: ``kl + band < certificate``, or ``c`` rejects no token of ``p`` at all; ``band``
  bounds how far the exact divergence may lie above the computed one (:func:`kl_band`, below).

The rule: ``KL < rho*  =>  accepted``. It holds for every maximiser of ``q`` and, with
``ties="worst"``, for every fixed tie-break of ``p``, so a certified step is accepted by every
decoder, exact ties included. (With ``ties="level-set"`` it fails at exact ties:
``p = [0.4, 0.4, 0.2]``, ``q = [0.39, 0.41, 0.2]`` gives ``KL = 0.0003 < rho* = 0.0437`` for
strict greedy, yet ``argmax p = 0 != 1 = argmax q``; the worst-case ``rho*`` there is 0.) The
converse does not hold (a certificate prices
the *worst* drafter within the budget, and a real drafter is rarely that one). Where ``c``
rejects no token of ``p`` (its worst-case rejection region is empty), ``rho* = +inf`` and every
drafter is certified, even one with infinite KL. ``rho* = +inf`` does not always mean that:
in the reverse direction it is also ``+inf`` when every rejected token has ``p = 0`` (no ``q'``
with finite ``KL(q' || p)`` puts its maximum there), and a drafter whose greedy token is such a
token has ``KL = +inf`` and is *not* certified (``p = [1, 0, 0]``, ``q = [0, 1, 0]``, greedy:
``rho* = +inf``, ``KL(q || p) = +inf``, rejected). So ``certified`` is ``KL < rho*`` or an empty
rejection region, never ``rho* = +inf`` alone; with that, ``certified => accepted`` holds on
every row under ``ties="worst"``, zeros and ``-inf`` logits included.

Rounding. A drafter can sit exactly on the boundary, ``KL = rho*``, and be rejected there: ``p =
[5/11, 0, 6/11]``, ``q = [1/2, 0, 1/2]`` under strict greedy is the witness itself (``argmax q = 0``
by the first-index rule, rejected), and float64 put the computed KL 6e-17 *below* the computed
``rho*`` with torch's plain (non-SIMD) kernels. So ``certified`` compares an upper bound of the
divergence with the certificate, which is itself never above the exact ``rho*`` of the input as
given (:mod:`companion.certify.certificates`, Precision): ``KL + band < rho*``. The band
(:func:`kl_band`) follows from :mod:`companion.certify.precision`: the divergence is
``D = sum a (log a - log b)`` over the normalised rows ``a = lambda_a a*``, ``b = lambda_b b*``
(``*`` exact; ``|log lambda| <= eta``, the normalisers' bounds, about 1e-7 for float32, bfloat16
and float16 rows and 1e-15 for float64 ones), so ``D = lambda_a (D* + log lambda_a - log
lambda_b)`` and ``D* <= D e^eta_a + eta_a + eta_b``; the float64 sum of ``V`` terms adds at most
``gamma_{V+2}`` of ``sum |a log a| + sum |a log b|``. A KL inside the band is not certified.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from companion.certify.certificates import certificates
from companion.certify.precision import U64, gamma
from companion.certify.summary import normalized_with_error
from companion.certify.criteria import Criterion, check_ties, parse_criteria, parse_criterion
from companion.certify.validation import check_distribution_tensor, check_divergence, warn_if_probabilities


def kl_band(kl: Tensor, magnitude: Tensor, eta_a: Tensor, eta_b: Tensor, vocab: int) -> Tensor:
    """How far the exact divergence may lie above the computed ``kl`` (module docstring, Rounding):
    ``kl (e^eta_a - 1) + eta_a + eta_b + gamma_{V+2} magnitude``, ``magnitude = sum |a log a| +
    sum |a log b|`` (``a``, ``b`` the divergence's two normalised rows, as summed)."""
    return kl * torch.expm1(eta_a) + eta_a + eta_b + gamma(vocab + 2, U64) * magnitude


def _kl_and_band(p: Tensor, q: Tensor, direction: str, from_logits: bool) -> tuple[Tensor, Tensor]:
    """``D(p, q)`` as :func:`~companion.certify.certificates.kl_divergence` computes it (from the same terms, so
    the same bits) and :func:`kl_band`."""
    a, eta_p = normalized_with_error(p, from_logits=from_logits, what="p")
    b, eta_q = normalized_with_error(q, from_logits=from_logits, what="q")
    if direction == "reverse":
        a, b, eta_p, eta_q = b, a, eta_q, eta_p
    own, cross = torch.xlogy(a, a), torch.xlogy(a, b)
    kl = (own - cross).sum(-1).clamp(min=0.0)
    # +inf where KL is: a > 0 where b == 0 makes cross -inf
    band = kl_band(kl, own.abs().sum(-1) + cross.abs().sum(-1), eta_p, eta_q, p.shape[-1])
    return kl, band


@dataclass(frozen=True)
class Certification:
    """One criterion's verdict on a drafter, per row (all tensors have ``p.shape[:-1]``).

    ``token``: the drafter's greedy token ``argmax q`` (int64; the lowest id among exact ties).
    ``accepted``: a decoder that breaks ties by token id accepts ``token`` under the criterion (bool).
    ``certified``: ``kl`` below ``certificate`` by more than the rounding band (module docstring), or the
    criterion rejects nothing (bool); certified implies accepted (``ties="worst"``).
    ``certificate``: ``rho*(p)`` in nats (float64, ``+inf`` where nothing is rejected).
    ``kl``: the drafter's divergence ``D(p, q)`` in nats (float64).
    """

    criterion: str
    divergence: str
    token: Tensor
    accepted: Tensor
    certified: Tensor
    certificate: Tensor
    kl: Tensor

    def __repr__(self) -> str:
        n = self.certified.numel()
        return (f"Certification({self.criterion!r}, {self.divergence}: {int(self.certified.sum())}/{n} certified, "
                f"{int(self.accepted.sum())}/{n} accepted)")


class Certifications(Mapping[str, Certification]):
    """The verdicts of several criteria, keyed by the criterion's spec string (``"additive:0.3"``).

    A :class:`~companion.certify.criteria.Criterion` or any spelling that parses to the same criterion
    works as a key too: ``result[AdditiveRelaxed(0.3)]`` and ``result["additive:.3"]`` are
    ``result["additive:0.3"]``.
    """

    def __init__(self, items: Sequence[Certification]) -> None:
        self._items = {c.criterion: c for c in items}

    def __getitem__(self, key: str | Criterion) -> Certification:
        spec = key if isinstance(key, str) and key in self._items else str(parse_criterion(key))
        try:
            return self._items[spec]
        except KeyError:
            raise KeyError(f"no verdict for criterion {spec!r}; computed: {', '.join(self._items)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return "Certifications(\n" + "".join(f"  {c!r},\n" for c in self._items.values()) + ")"


def certified(
    p: Tensor,
    q: Tensor,
    criteria: Sequence[Criterion | str] | Criterion | str,
    *,
    from_logits: bool = False,
    divergence: str = "forward",
    ties: str = "worst",
    logits_dtype: str | None = None,
) -> Certifications:
    """Whether the drafter ``q``'s greedy token is certified, and accepted, under each criterion.

    ``p``: the target's next-token distributions ``[..., V]``, ``q``: the drafter's, same shape;
    probabilities, or logits of both with ``from_logits=True`` (any float dtype). ``criteria``:
    specs or :class:`~companion.certify.criteria.Criterion` objects (one, a list, or a ``;``-separated
    string). ``divergence``: ``"forward"`` (``KL(p || q)``) or ``"reverse"`` (``KL(q || p)``).
    ``ties``: the certificates' tie convention, ``"worst"`` (default) or ``"level-set"``
    (analysis only: then certified steps at exact ties may be rejected); ``accepted`` is the
    decoders' first-index verdict either way. ``logits_dtype``: the dtype the logits were computed
    in (:func:`~companion.certify.certificates.certificates`): its kernel-path band counts as a tie.

    With ``from_logits=True``, a ``p`` whose every row lies in [0, 1] and sums to 1 (probabilities,
    most likely) draws one ``UserWarning`` per call
    (``companion.certify.validation.warn_if_probabilities``).

    Returns a :class:`Certifications` mapping each criterion's spec to a :class:`Certification`
    with, per row, ``certified`` (``KL < rho*`` by more than the rounding band of the module docstring, or an
    empty rejection region) and ``accepted``;
    ``certified => accepted`` holds on every row under ``ties="worst"``, zeros and ``-inf``
    logits included (module docstring).
    """
    check_ties(ties)
    check_divergence(divergence)
    what_p, what_q = ("target logits", "drafter logits") if from_logits else ("p", "q")
    check_distribution_tensor(p, what_p)
    check_distribution_tensor(q, what_q)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape [..., V], got {tuple(p.shape)} and {tuple(q.shape)}")
    if from_logits:
        # Once per call, at the caller's line (stacklevel 3: warn_if_probabilities, this function,
        # its caller): probabilities passed as logits give wrong certificates with no error.
        warn_if_probabilities(p, "target logits", stacklevel=3)
    crits = parse_criteria(criteria)
    if not crits:
        raise ValueError("criteria is empty: give at least one criterion spec, e.g. 'greedy'")
    certs = certificates(p, crits, [divergence], from_logits=from_logits, ties=ties, logits_dtype=logits_dtype)
    kl, band = _kl_and_band(p, q, divergence, from_logits)
    token = q.argmax(-1)
    out = []
    for c in crits:
        rho = certs[(str(c), divergence)]
        # rho = +inf with KL = +inf certifies only where nothing is rejected: in reverse, rho is
        # +inf also when every rejected token has p = 0, and a draft on one of them is rejected.
        nothing_rejected = ~c.rejection_mask(p, from_logits=from_logits, ties=ties).any(-1)
        out.append(Certification(
            criterion=str(c), divergence=divergence, token=token,
            accepted=c.decoder_accepts(p, token, from_logits=from_logits),
            certified=(kl + band < rho) | (torch.isposinf(rho) & nothing_rejected),
            certificate=rho, kl=kl,
        ))
    return Certifications(out)

"""Tree certificates under the kernel-path band, against exhaustive enumeration.

With bfloat16 logits the decoder's greedy token may be any token whose logit lies within the band
(``TIE_ULPS`` ulps of the top logit) of the largest, whichever kernel path verifies. A width-``m``
tree then succeeds on every path only if the drafter's top ``m`` holds every such token, so its
certificate is ``min over g in the band of inf { D(p, q) : m tokens z != g have q_z >= q_g }``.
The oracle enumerates that directly on small vocabularies: every ``g`` in the band, every set
``S`` of ``m`` competitors, every subset ``B`` of ``S`` pooled with ``g`` (``q`` flat on
``{g} + B`` at the arithmetic mean, forward, or at the geometric mean, reverse; ``q`` proportional
to ``p`` elsewhere), kept when the competitors outside the pool still reach the pooled level; the
constrained minimiser is one of these candidates, so their least cost is the certificate.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from companion import certificates
from companion.certify.precision import tie_band
from companion.harvest.ties import TIE_ULPS


def _pool_cost(p: np.ndarray, pool: tuple[int, ...], divergence: str) -> tuple[float, float]:
    """(level the competitors must reach, cost) of flattening ``q`` on ``pool``."""
    vals = p[list(pool)]
    if divergence == "forward":
        level = float(vals.mean())
        return level, math.fsum(float(v) * math.log(float(v) / level) for v in vals if v > 0)
    g = math.exp(math.fsum(math.log(float(v)) for v in vals) / len(vals))
    return g, -math.log1p(-(math.fsum(float(v) for v in vals) - len(vals) * g))


def oracle(p: np.ndarray, band_tokens: list[int], m: int, divergence: str) -> float:
    best = math.inf
    v = len(p)
    for g in band_tokens:
        others = [z for z in range(v) if z != g]
        for comp in itertools.combinations(others, m):
            for r in range(len(comp) + 1):
                for pooled in itertools.combinations(comp, r):
                    level, cost = _pool_cost(p, (g,) + pooled, divergence)
                    if all(p[z] >= level * (1 - 1e-15) for z in comp if z not in pooled):
                        best = min(best, max(cost, 0.0))   # a KL: rounding may leave -1e-17
    return best


def _rows(seed: int, n: int, v: int) -> torch.Tensor:
    """bfloat16 logits near 20 (ulp 0.125): the top few tokens 0 to TIE_ULPS + 2 ulps apart, the rest lower."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, v))
    for i in range(n):
        k = int(rng.integers(1, 5))
        top = 20.0 - 0.125 * np.sort(rng.integers(0, TIE_ULPS + 3, size=k))
        rest = 20.0 - rng.uniform(0.2, 4.0, size=v - k)
        out[i] = rng.permutation(np.concatenate([top, rest]))
    return torch.tensor(out).to(torch.bfloat16)


@pytest.mark.parametrize("divergence", ["forward", "reverse"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_band_tree_certificate_is_the_enumerated_minimum(divergence: str, m: int) -> None:
    logits = _rows(10 * m + (divergence == "reverse"), 40, 7)
    got = certificates(logits, (), divergence, tree_widths=[m], from_logits=True)[(f"tree:{m}", divergence)]
    exact = certificates(logits, (), divergence, tree_widths=[m], from_logits=True,
                         logits_dtype="exact")[(f"tree:{m}", divergence)]
    z = logits.double()
    p_all = torch.softmax(z, -1).numpy()
    n_band_rows = 0
    for i in range(logits.shape[0]):
        zi = z[i].numpy()
        band = float(tie_band(zi.max(), "bfloat16"))
        in_band = [j for j in range(len(zi)) if zi.max() - zi[j] <= band]
        n_band_rows += len(in_band) > 1
        want = oracle(p_all[i], in_band, m, divergence)
        have = float(got[i])
        # the library's value is lowered by its rounding bound (float32 pass: ~1e-6 relative), never above
        assert have <= want * (1 + 1e-12) + 1e-300, (i, m, divergence, have, want, in_band)
        assert have >= want * (1 - 1e-5) - 1e-12, (i, m, divergence, have, want, in_band)
        assert have <= float(exact[i]), (i, have, float(exact[i]))   # bit for bit: never above, exact ties included
        if len(in_band) > m:
            assert have == 0.0, (i, m, have, in_band)
    assert n_band_rows >= 10, f"only {n_band_rows} of 40 rows have a near tie: the test would not test the band"


def test_without_a_near_tie_the_band_changes_nothing() -> None:
    logits = torch.full((3, 50), -3.0)
    logits[:, :5] = torch.tensor([[20.0, 19.0, 18.5, 18.0, 17.0], [20.0, 18.0, 18.0, 17.0, 16.0],
                                  [22.0, 21.0, 20.0, 19.0, 18.0]])
    for m in (1, 2, 4):
        banded = certificates(logits.to(torch.bfloat16), (), "forward", tree_widths=[m], from_logits=True)
        exact = certificates(logits.to(torch.bfloat16), (), "forward", tree_widths=[m], from_logits=True,
                             logits_dtype="exact")
        assert torch.equal(banded[(f"tree:{m}", "forward")], exact[(f"tree:{m}", "forward")]), m


def test_a_one_ulp_tie_keeps_a_positive_tree_certificate_but_not_greedy() -> None:
    """Strict greedy's certificate is 0 at a 1-ulp tie; a width-2 tree that must hold both tied
    tokens keeps a positive one, below the exact-ties value (the second token is the anchor)."""
    logits = torch.full((1, 1000), -4.0)
    logits[0, :3] = torch.tensor([20.0, 19.875, 17.0])
    logits = logits.to(torch.bfloat16)
    c = certificates(logits, ["greedy"], "forward", tree_widths=[2], from_logits=True)
    e = certificates(logits, ["greedy"], "forward", tree_widths=[2], from_logits=True, logits_dtype="exact")
    assert float(c[("greedy", "forward")]) == 0.0 and float(e[("greedy", "forward")]) > 0
    assert 0 < float(c[("tree:2", "forward")]) < float(e[("tree:2", "forward")])


def test_the_harvest_stores_band_tree_columns_and_traces_recompute_them() -> None:
    """StepStatistics' path_tree_cert columns are the library's banded tree certificates, equal to
    what the stored top-k gives under the same band; Traces.under_kernel_paths swaps them in and
    computes the widths the harvest did not store under that band too."""
    from companion.analysis.traces import Traces, tree_certificates_from_top
    from companion.certify.precision import tie_band
    from companion.harvest.stats import StepStatistics

    logits = _rows(3, 24, 300).float()
    logits[:, 7:] -= 6.0   # a long low tail, below the near-tied head
    logits = logits.to(torch.bfloat16)
    stats = StepStatistics(["greedy"], [2, 4], vocab=logits.shape[1], path_dtype="bfloat16")
    cols = stats(logits, logits)
    cols = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in cols.items()}
    band = tie_band(logits.double().amax(-1).numpy(), "bfloat16")
    for m in (2, 4):
        want = certificates(logits, (), "forward", tree_widths=[m], from_logits=True)[(f"tree:{m}", "forward")]
        assert np.array_equal(cols[f"path_tree_cert_fwd[{m}]"], want.numpy()), m
        assert np.all(cols[f"path_tree_cert_fwd[{m}]"] <= cols[f"tree_cert_fwd[{m}]"]), m
        again = tree_certificates_from_top(cols["top_probs"], m, "forward", tail=cols["top_tail"], band=band)
        np.testing.assert_allclose(again, cols[f"path_tree_cert_fwd[{m}]"], rtol=3e-6, atol=1e-13)
    assert np.any(cols["path_tree_cert_fwd[2]"] < cols["tree_cert_fwd[2]"]), "no row where the band lowers the tree"
    table = {k: (list(v) if getattr(v, "ndim", 1) > 1 else v) for k, v in cols.items()}
    traces = Traces.from_columns({**table, "prompt_id": ["a"] * 24, "step": np.arange(24)},
                                 {"config": {"dtype": "bfloat16"}})
    path = traces.under_kernel_paths()
    assert np.array_equal(path.tree_cert(2), cols["path_tree_cert_fwd[2]"])
    assert np.array_equal(path.column("tree_certified_fwd[4]"), cols["path_tree_certified_fwd[4]"])
    three = path.tree_cert(3)   # not stored: from the top-k, under the band
    np.testing.assert_allclose(three, tree_certificates_from_top(cols["top_probs"], 3, tail=cols["top_tail"], band=band))
    assert np.all(three <= traces.tree_cert(3) * (1 + 1e-12)) and np.any(three < traces.tree_cert(3))


def test_a_band_holding_the_whole_vocabulary_gives_zero() -> None:
    """Every token tied (a flat bfloat16 row of 40 logits): the band holds all of them, more than m, so
    the tree certificate is 0; the summary already covers the vocabulary (no wider one to ask for)."""
    logits = torch.full((2, 40), 3.0, dtype=torch.bfloat16)
    logits[1, :5] = torch.tensor([9.0, 9.0, 9.0, 9.0, 9.0])   # five tied at the top, the rest far below
    out = certificates(logits, ["greedy"], "forward", tree_widths=[2, 4, 8], from_logits=True)
    assert float(out[("tree:2", "forward")][0]) == 0.0 and float(out[("tree:8", "forward")][0]) == 0.0
    assert float(out[("tree:4", "forward")][1]) == 0.0 and float(out[("tree:8", "forward")][1]) > 0.0

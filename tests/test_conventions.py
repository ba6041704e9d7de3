"""The two tie conventions side by side (companion.analysis.conventions)."""
from __future__ import annotations

import numpy as np
import pytest

from companion.analysis.conventions import convention_rows, kernel_path_greedy, near_tie_count
from companion.analysis.traces import Traces


def _traces(with_paths: bool) -> Traces:
    cols = {"prompt_id": ["a"] * 4, "step": [0, 1, 2, 3],
            "cert_fwd[greedy]": [0.3, 0.02, 0.0, 0.5], "cert_fwd[topm:4]": [0.6, 0.4, 0.3, 0.7],
            "logit_top1": [20.0, 20.0, 20.0, 3.0], "logit_gap": [3.0, 0.125, 0.0, 0.03]}
    cols["tree_cert_fwd[2]"] = [0.9, 0.5, 0.4, 1.0]
    if with_paths:
        cols["path_cert_fwd[greedy]"] = [0.3, 0.0, 0.0, 0.0]
        cols["path_cert_fwd[topm:4]"] = [0.6, 0.35, 0.3, 0.7]
        cols["path_tree_cert_fwd[2]"] = [0.9, 0.2, 0.1, 1.0]
    return Traces.from_columns(cols)


def test_kernel_path_greedy_zeroes_near_ties_only() -> None:
    got = kernel_path_greedy(np.array([0.3, 0.02, 0.0, 0.5]), np.array([20.0, 20.0, 20.0, 3.0]),
                             np.array([3.0, 0.125, 0.0, 0.03]), "bfloat16")
    # bfloat16 ulp at 20 is 0.125 (band of 4 ulps: 0.5), at 3 it is 2^-6 (band 0.0625)
    assert got.tolist() == [0.3, 0.0, 0.0, 0.0]
    assert kernel_path_greedy(np.array([0.02]), np.array([20.0]), np.array([0.125]), "float32").tolist() == [0.02]


def test_convention_rows_from_columns_and_derived() -> None:
    with_cols = {r.criterion: r for r in convention_rows(_traces(True), ["greedy", "topm:4"], "bfloat16")}
    assert with_cols["greedy"].lowered == 2 and with_cols["topm:4"].lowered == 1
    assert with_cols["tree:2"].lowered == 2 and with_cols["tree:2"].median_paths == pytest.approx(0.2)   # the lower median, as quantile()
    assert with_cols["greedy"].median_exact == pytest.approx(0.02) and with_cols["greedy"].median_paths == 0.0
    derived = convention_rows(_traces(False), ["greedy", "topm:4"], "bfloat16")
    assert [r.criterion for r in derived] == ["greedy"] and derived[0].lowered == 2
    assert near_tie_count(_traces(False), "bfloat16") == 3


def test_convention_rows_refuse_a_larger_kernel_path_certificate() -> None:
    bad = _traces(True)
    cols = {n: bad.column(n) for n in bad.table.column_names}
    cols["path_cert_fwd[greedy]"] = np.array([0.4, 0.0, 0.0, 0.0])
    cols["prompt_id"] = ["a"] * 4
    with pytest.raises(ValueError, match="above the exact-ties"):
        convention_rows(Traces.from_columns(cols), ["greedy"], "bfloat16")

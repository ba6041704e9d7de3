"""The kernel-path measurement: the four paths read the same text, and the flips and gaps are counted right."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from companion.certify.precision import TIE_ULPS
from companion.harvest.kernel_paths import (
    PATHS,
    PathRows,
    band_check,
    band_margin,
    committed_record,
    compare,
    measure_kernel_paths,
)


def _tiny(dtype: torch.dtype) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return Qwen2ForCausalLM(config).to(dtype).eval()


PROMPTS = [[5, 17, 3, 9], [40, 2, 2, 71, 8, 8, 13], [1, 90], [33, 34, 35, 36, 37]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_path_reads_the_decoders_text(dtype: torch.dtype) -> None:
    model = _tiny(dtype)
    seen: list[str] = []
    got = measure_kernel_paths(model, PROMPTS, 12, k=3, batch_size=3, eos_ids=(7,), on_prompt=seen.append)
    n = sum(got["lengths"])
    assert all(1 <= length <= 12 for length in got["lengths"]), got["lengths"]
    assert set(got["paths"]) == set(PATHS)
    for name, rows in got["paths"].items():
        assert rows.token.shape == (n,), (name, rows.token.shape, n)
        assert np.all(rows.z1 >= rows.z2), name
        assert np.all(rows.token != rows.runner_up), name
    assert seen.count("batch") == 2 and len(seen) == len(PROMPTS) + 2, seen
    decode = got["paths"]["decode"]
    if dtype == torch.float32:
        # In float32 the paths agree to rounding: same greedy tokens (the tiny model's gaps are wide),
        # top logits within 1e-4.
        for name in ("verify", "full", "batch"):
            rows = got["paths"][name]
            assert np.array_equal(rows.token, decode.token), name
            assert np.max(np.abs(rows.z1 - decode.z1)) < 1e-4, (name, np.max(np.abs(rows.z1 - decode.z1)))


def test_teacher_forcing_follows_the_text_not_the_path() -> None:
    """The batch path's rows of a prompt are those of the same prompt alone in a batch of one."""
    model = _tiny(torch.float32)
    alone = measure_kernel_paths(model, PROMPTS[1:2], 10, k=2, batch_size=1)
    together = measure_kernel_paths(model, PROMPTS, 10, k=2, batch_size=4)
    start = together["lengths"][0]
    stop = start + together["lengths"][1]
    np.testing.assert_allclose(together["paths"]["batch"].z1[start:stop], alone["paths"]["batch"].z1, atol=1e-4)
    assert np.array_equal(together["paths"]["decode"].token[start:stop], alone["paths"]["decode"].token)


def _rows(tokens, z1, z2) -> PathRows:
    tokens = np.asarray(tokens)
    return PathRows(tokens, tokens + 1, np.asarray(z1, dtype=float), np.asarray(z2, dtype=float))


def test_flips_and_their_gaps_in_ulps() -> None:
    # bfloat16 at 20: ulp 0.125. Step 1 flips between decode and full at gaps of 1 and 2 ulps.
    decode = _rows([3, 4, 5], [20.0, 20.0, 20.0], [19.0, 19.875, 19.5])
    full = _rows([3, 9, 5], [20.0, 20.0, 20.125], [19.0, 19.75, 19.5])
    flips, moves = compare({"decode": decode, "full": full}, "bfloat16")
    assert [(f.a, f.b, f.step, f.gap_ulps_a, f.gap_ulps_b) for f in flips] == [("decode", "full", 1, 1.0, 2.0)]
    assert moves["decode/full"]["flips"] == 1
    assert moves["decode/full"]["top1_max"] == 1.0  # 20.125 vs 20 at step 2
    assert moves["decode/full"]["gap_max"] == 1.0  # step 2: gap 0.625 vs 0.5 with the same two tokens
    check = band_check({"decode": decode, "full": full}, "bfloat16", band_ulps=2)
    assert check.covers and check.widest_flip_ulps == 2.0 and check.within_band == 1 and check.flips == 1
    assert check.flip_steps == 1
    narrow = band_check({"decode": decode, "full": full}, "bfloat16", band_ulps=1.5)
    assert not narrow.covers and narrow.outside == 1


def test_paths_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different numbers of steps"):
        compare({"decode": _rows([1, 2], [1, 1], [0, 0]), "full": _rows([1], [1], [0])}, "bfloat16")


def test_rows_round_trip_through_json() -> None:
    rows = _rows([3, 4], [20.0, 19.875], [19.0, 19.875])
    back = PathRows.from_json(json.loads(json.dumps(rows.to_json())))
    for name in ("token", "runner_up", "z1", "z2"):
        assert np.array_equal(getattr(back, name), getattr(rows, name)), name


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        measure_kernel_paths(_tiny(torch.float32), PROMPTS, 0)


def test_committed_records_are_read_and_checked(tmp_path) -> None:
    assert committed_record("nothing-here", tmp_path) is None
    rows = _rows([3, 4], [20.0, 19.875], [19.0, 19.875]).to_json()
    (tmp_path / "good.json").write_text(json.dumps({"lengths": [2], "paths": {"decode": rows, "full": rows}}))
    record, paths = committed_record("good", tmp_path)
    assert record["lengths"] == [2] and set(paths) == {"decode", "full"}
    (tmp_path / "short.json").write_text(json.dumps({"lengths": [3], "paths": {"decode": rows}}))
    with pytest.raises(ValueError, match="do not add up"):
        committed_record("short", tmp_path)
    (tmp_path / "bad.json").write_text('{"lengths": [1]}')
    with pytest.raises(ValueError, match="not a kernel-path measurement"):
        committed_record("bad", tmp_path)


def test_the_committed_measurement_supports_the_band() -> None:
    """The tie band the certificates apply covers every flip measured on the default pair's kernel paths;
    if a re-measurement finds a wider one, this fails and the band must widen."""
    got = committed_record("qwen2.5-coder")
    assert got is not None, "companion/assets/kernel_paths/qwen2.5-coder.json is missing"
    record, paths = got
    assert set(paths) == set(PATHS) and record["dtype"] == "bfloat16", (set(paths), record["dtype"])
    check = band_check(paths, record["dtype"], TIE_ULPS)
    assert check.steps >= 2000, f"only {check.steps} steps measured"
    assert check.covers, (check.outside, check.widest_flip_ulps)


def test_the_band_margin_names_the_move_and_the_wider_band() -> None:
    # At 20 (bfloat16 ulp 0.125): gaps of 1, 3 and 8 ulps on the decode path; the gap of step 1 moves by 2 ulps.
    decode = _rows([3, 4, 5], [20.0, 20.0, 20.0], [19.875, 19.625, 19.0])
    full = _rows([3, 4, 5], [20.0, 20.0, 20.0], [19.875, 19.875, 19.0])
    m = band_margin({"decode": decode, "full": full}, "bfloat16", band_ulps=2)
    assert (m.gap_move_ulps, m.widest_flip_ulps, m.wider_band_ulps) == (2.0, 0.0, 3.0) and not m.has_margin
    assert (m.near_share, m.wider_share) == pytest.approx((1 / 3, 2 / 3))
    calm = band_margin({"decode": decode, "full": decode}, "bfloat16", band_ulps=2)
    assert calm.gap_move_ulps == 0.0 and calm.has_margin and calm.near_share == pytest.approx(1 / 3)

"""The size axis: statistics, their bootstrap over prompts, sizes, orderings and the figure's plotted values."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import analysis as A
from companion.analysis import size_axis as S
from companion.models.sizes import non_embedding_parameters
from companion.figures.sizes import FIGURE_NAMES, size_figure


def _traces(lengths: list[int], seed: int = 0) -> A.Traces:
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    cols: dict = {"prompt_id": [f"p{i}" for i, k in enumerate(lengths) for _ in range(k)],
                  "step": [s for k in lengths for s in range(k)],
                  "p_top1": rng.uniform(0.1, 1.0, n), "top10_mass": rng.uniform(0.5, 1.0, n)}
    for s in S.STATISTICS:
        if s.column not in cols:
            vals = rng.exponential(0.5, n)
            vals[rng.random(n) < 0.1] = np.inf  # criteria that reject nothing on some steps
            cols[s.column] = vals
    return A.Traces.from_columns(cols)


def test_statistics_match_the_chapter_summary() -> None:
    t = _traces([5, 9, 3])
    for s in S.STATISTICS:
        summary = A.summarize_values(S.values(t, s.column))
        assert S.summary_statistic(S.values(t, s.column), s.stat) == getattr(summary, s.stat)
    with pytest.raises(ValueError, match="unknown statistic 'p95'"):
        S.summary_statistic(np.ones(3), "p95")


def test_every_reported_statistic_is_in_the_table_and_the_families() -> None:
    assert set(S.REPORTED) == {s.key for s in S.STATISTICS}
    assert S.FAMILIES == ("top-1 probability", "strict greedy's certificate", "relaxed criteria",
                          "tree certificates", "top-10 mass")
    assert set(FIGURE_NAMES) == set(S.FAMILIES) and len(set(FIGURE_NAMES.values())) == len(S.FAMILIES)


def test_bootstrap_resamples_prompts_not_steps() -> None:
    """With one prompt, every resample is that prompt: the interval is the value itself."""
    t = _traces([40])
    e = S.bootstrap_statistic(t, "p_top1", "median", n_boot=50)
    assert e.low == e.value == e.high


def _brute_bootstrap(t: A.Traces, col: str, stat: str, n_boot: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    x = S.values(t, col)
    blocks = [x[s:s + n] for s, n in zip(t.starts, t.lengths)]
    draws = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(blocks), len(blocks))
        draws.append(S.summary_statistic(np.concatenate([blocks[i] for i in pick]), stat))
    kept = [d for d in draws if not math.isnan(d)]
    return (A.quantile(np.array(kept), 0.025), A.quantile(np.array(kept), 0.975))


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=2, max_size=8), seed=st.integers(0, 10_000),
       which=st.sampled_from(S.STATISTICS))
def test_bootstrap_equals_a_plain_loop_and_brackets_a_value_it_can_reach(lengths: list[int], seed: int,
                                                                          which: S.Statistic) -> None:
    t = _traces(lengths, seed)
    e = S.bootstrap_statistic(t, which.column, which.stat, n_boot=64, seed=seed)
    assert (e.low, e.high) == pytest.approx(_brute_bootstrap(t, which.column, which.stat, 64, seed))
    assert e.low <= e.high
    x = S.values(t, which.column)
    finite = x[np.isfinite(x)]
    bounds = (finite.min(), finite.max()) if which.stat == "mean" else (x.min(), x.max())
    assert bounds[0] <= e.low and e.high <= bounds[1]  # a resample's statistic lies within the data


def test_non_embedding_parameters_counts_an_untied_head_twice(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": True}))
    assert non_embedding_parameters(tmp_path, 100) == 60
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": False}))
    assert non_embedding_parameters(tmp_path, 100) == 20


def _point(name: str, size: int, value: float, half: float) -> S.SizePoint:
    return S.SizePoint(name, size, 1, 1, {("p_top1", "p5"): S.Estimate(value, value - half, value + half)})


@pytest.mark.parametrize("values, half, words", [
    ((0.1, 0.2, 0.3), 0.01, "rises"), ((0.3, 0.2, 0.1), 0.01, "falls"),
    ((0.1, 0.2, 0.3), 0.06, "rises (overlapping)"), ((0.1, 0.3, 0.2), 0.01, "no order"),
    ((0.2, 0.2, 0.3), 0.01, "no order"),
])
def test_ordering_has_a_word_for_every_outcome(values: tuple[float, ...], half: float, words: str) -> None:
    points = [_point(f"m{i}", size, v, half) for i, (size, v) in enumerate(zip((300, 100, 200), values))]
    # sorted by size the values run values[1], values[2], values[0]: rebuild so that size order is the given order
    points = [_point(f"m{i}", (i + 1) * 100, v, half) for i, v in enumerate(values)][::-1]
    assert S.ordering(points, ("p_top1", "p5")) == words


def test_the_figure_plots_the_estimates_and_the_reported_values() -> None:
    t1, t2 = _traces([6, 7, 8], 1), _traces([9, 4], 2)
    points = [S.size_point("big", t1, 2_000_000_000, n_boot=20), S.size_point("small", t2, 100_000_000, n_boot=20)]
    for family in S.FAMILIES:
        fig = size_figure(points, family)
        ax = fig.axes[0]
        lines = {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}
        for s in (s for s in S.STATISTICS if s.family == family):
            x, y = lines[f"measured:{s.label}"].get_data()
            assert list(x) == [100_000_000, 2_000_000_000]
            assert list(y) == [points[1].estimates[s.key].value, points[0].estimates[s.key].value]
            rx, ry = lines[f"second-hand:{s.label}"].get_data()
            assert list(ry) == [v for v in S.REPORTED[s.key] if v is not None]
        assert ax.get_xscale() == "log"
        # the plot names the note's values as the tables do: second-hand, never "reported"
        words = " ".join(t.get_text() for t in [ax.title, *ax.texts])
        assert "second-hand" in words and "reported" not in words, words
    with pytest.raises(ValueError, match="unknown family 'top-2'"):
        size_figure(points, "top-2")


def test_by_family_splits_by_the_prompt_ids_first_word_and_keeps_answers_whole() -> None:
    t = A.Traces.from_columns({"prompt_id": ["chat-0001-code"] * 3 + ["stdlib-0001-test"] * 2 + ["chat-0002-advice"],
                               "step": [0, 1, 2, 0, 1, 0], "p_top1": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    fams = S.by_family(t)
    assert list(fams) == ["chat", "stdlib"]
    assert fams["chat"].column("p_top1").tolist() == [0.1, 0.2, 0.3, 0.6] and fams["chat"].n_trajectories == 2
    assert fams["stdlib"].lengths.tolist() == [2]
    assert S.family_of("line-00001") == "other"


def _three_sizes() -> list[S.SizePoint]:
    """The chapter's three targets by name and non-embedding size, on made-up traces."""
    sizes = (("SmolLM2-135M-Instruct", 106_000_000), ("Qwen2.5-Coder-0.5B-Instruct", 358_000_000),
             ("Qwen2.5-Coder-1.5B-Instruct", 1_310_000_000))
    return [S.size_point(name, _traces([20, 30, 25], seed), size, n_boot=20) for seed, (name, size) in enumerate(sizes)]


@pytest.mark.parametrize("family", S.FAMILIES)
def test_the_size_figures_read_on_a_phone(family: str) -> None:
    """Issue 56: at 390 px the size figures' text was unreadable. Drawn for a phone, every text reads at
    least PHONE_MIN_PT there (and MIN_DISPLAY_PT on a wide screen, where the stylesheet caps the figure at
    PHONE_DESKTOP_PX), and no two texts overlap."""
    from matplotlib.text import Text

    from companion.figures import palette as P
    from tests.figure_checks import drawn, extent, overlapping, saved_width_in

    fig = drawn(size_figure(_three_sizes(), family))
    width = saved_width_in(fig)
    phone, desktop = P.PHONE_WIDTH_IN / width, min(P.PHONE_DESKTOP_PX / 96, P.DISPLAY_WIDTH_IN) / width
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    small = [(t.get_text(), round(t.get_fontsize() * phone, 1)) for t in texts if t.get_fontsize() * phone < P.PHONE_MIN_PT]
    assert not small, f"{family}: under {P.PHONE_MIN_PT} pt on a phone: {small}"
    assert min(t.get_fontsize() for t in texts) * desktop >= P.MIN_DISPLAY_PT
    # the names, title, axis label and legend entries: no two overlap (tick labels are matplotlib's)
    ax = fig.axes[0]
    named = [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_legend().get_texts()]
    boxes = [extent(t, fig) for t in named]
    clash = [(named[i].get_text(), named[j].get_text()) for i, j in overlapping(boxes, pad=1.0)]
    assert not clash, f"{family}: texts overlap: {clash}"


def test_card_parameters_counts_the_qwen_head_once_when_the_folder_is_here_and_trusts_the_manifest_elsewhere(tmp_path):
    """The status page and the decode-time chapters describe a model by card_parameters: its folder's count
    when the folder is on this machine, else the manifest's own number."""
    import json

    from companion.models.sizes import card_parameters

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": True}))
    assert card_parameters({"name": str(folder), "parameters": 77}) == 77      # no weights: the count given
    assert card_parameters({"name": str(tmp_path / "elsewhere"), "parameters": 1234}) == 1234
    assert card_parameters({"parameters": 5}) == 5

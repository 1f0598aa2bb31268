import numpy as np
import pytest

from raypipe.analysis.bootstrap import headline_intervals, ratio_ci
from raypipe.analysis.report import ReportContext, RunMeta
from raypipe.analysis.stats import trajectory_summary
from raypipe.core.config import ReportConfig
from tests.helpers.analysis_run import build_run_dir


def test_same_seed_same_interval_other_seed_other_interval():
    rng = np.random.default_rng(1)
    values = rng.random(40)
    ones = np.ones(40)
    first = ratio_ci(values, ones, samples=500, seed=7)
    assert ratio_ci(values, ones, samples=500, seed=7) == first
    assert ratio_ci(values, ones, samples=500, seed=8) != first
    estimate, low, high = first
    assert estimate == pytest.approx(values.mean())
    assert low < estimate < high


def test_interval_narrows_with_more_questions_and_widens_with_confidence():
    rng = np.random.default_rng(2)
    small, large = rng.random(20), rng.random(2000)
    width = lambda ci: ci[2] - ci[1]  # noqa: E731
    assert width(ratio_ci(large, np.ones(2000), 400, 0)) < width(ratio_ci(small, np.ones(20), 400, 0))
    assert width(ratio_ci(small, np.ones(20), 400, 0, confidence=0.99)) > width(
        ratio_ci(small, np.ones(20), 400, 0, confidence=0.5)
    )


def test_constant_values_give_a_point_interval_and_ratio_of_sums():
    assert ratio_ci(np.full(10, 0.3), np.ones(10), 200, 0) == pytest.approx((0.3, 0.3, 0.3))
    # mean over pooled iterations, not the mean of per-question means: (1 + 0) / (1 + 3)
    estimate, _, _ = ratio_ci(np.array([1.0, 0.0]), np.array([1.0, 3.0]), 200, 0)
    assert estimate == pytest.approx(0.25)


def test_undefined_figures_are_nan():
    assert all(np.isnan(ratio_ci(np.array([]), np.array([]), 10, 0)))
    assert all(np.isnan(ratio_ci(np.zeros(3), np.zeros(3), 10, 0)))


def test_chunked_resampling_matches_one_chunk(monkeypatch):
    import raypipe.core.stats as core_stats

    values, ones = np.linspace(0, 1, 50), np.ones(50)
    whole = ratio_ci(values, ones, 300, 3)
    monkeypatch.setattr(core_stats, "_CHUNK", 500)  # 10 resamples per chunk
    chunked = ratio_ci(values, ones, 300, 3)
    assert chunked == whole  # the same resamples, drawn in blocks


def test_headline_intervals_of_the_hand_built_run(tmp_path):
    run = build_run_dir(tmp_path / "run")
    ctx = ReportContext(run, tmp_path / "out", ReportConfig(), RunMeta.read(run))
    summary = trajectory_summary(*ctx.frames(), 1e-6)
    cis = headline_intervals(summary, samples=300, seed=0)
    again = headline_intervals(summary, samples=300, seed=0)
    assert cis.equals(again)
    hp = cis[(cis["dataset"] == "hotpotqa")].set_index("figure")
    assert hp.loc["final F1", "estimate"] == pytest.approx(0.75)
    assert hp.loc["oracle iterations saved", "estimate"] == pytest.approx(6 / 9)
    assert hp.loc["zero-utility share", "estimate"] == pytest.approx(5 / 9)
    assert (hp["low"] <= hp["estimate"] + 1e-12).all() and (hp["estimate"] <= hp["high"] + 1e-12).all()
    # final F1 values are 1, .5, .5, 1: every resample mean lies in [.5, 1]
    assert 0.5 <= hp.loc["final F1", "low"] and hp.loc["final F1", "high"] <= 1.0


def test_figures_share_resamples():
    from raypipe.analysis.bootstrap import ratio_cis

    values, ones = np.linspace(0, 1, 30), np.ones(30)
    both = ratio_cis(np.stack([values, values]), np.stack([ones, ones]), 300, 5)
    assert both[0] == both[1] == ratio_ci(values, ones, 300, 5)

"""Shared statistics: Pearson r over finite pairs, the question resamples and the percentile interval."""

import math

import numpy as np
import pytest

from raypipe.core import stats


def test_finite_pairs_drop_none_nan_and_inf():
    a, b = stats.finite_pairs([1.0, None, 3.0, float("inf"), 5.0], [1.0, 2.0, float("nan"), 4.0, 6.0])
    assert a.tolist() == [1.0, 5.0] and b.tolist() == [1.0, 6.0]


def test_pearson_needs_three_pairs_and_two_varying_sides():
    assert stats.pearson([1, 2, 3, None], [2, 4, 7, 1]) == pytest.approx(np.corrcoef([1, 2, 3], [2, 4, 7])[0, 1])
    assert math.isnan(stats.pearson([1, 2], [1, 2]))
    assert math.isnan(stats.pearson([1, 1, 1], [1, 2, 3]))


def test_resamples_are_the_same_draws_however_blocked(monkeypatch):
    whole = np.concatenate(list(stats.resamples(7, 20, seed=5)))
    monkeypatch.setattr(stats, "_CHUNK", 14)  # 2 resamples per block
    blocks = list(stats.resamples(7, 20, seed=5))
    assert [len(b) for b in blocks] == [2] * 10
    assert (np.concatenate(blocks) == whole).all() and whole.shape == (20, 7)
    assert whole.min() >= 0 and whole.max() <= 6


def test_percentile_interval_skips_undefined_resamples():
    values = np.array([np.nan, np.inf, *np.linspace(0, 1, 101)])
    assert stats.percentile_interval(values, 0.9) == pytest.approx((0.05, 0.95))
    assert all(math.isnan(v) for v in stats.percentile_interval(np.array([np.nan]), 0.95))

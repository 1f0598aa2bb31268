import math

import numpy as np
import pytest
from scipy import stats

from raypipe.core.stats import pearson
from raypipe.predict import evaluate

Y = np.array([0.0, 0.2, 0.5, 0.5, 1.0, 0.8, 0.1, 0.0])
P = np.array([0.1, 0.3, 0.4, 0.6, 0.7, 0.9, 0.0, 0.2])


def test_pearson_and_kendall_match_scipy():
    assert pearson(Y, P) == pytest.approx(stats.pearsonr(Y, P)[0])
    assert evaluate.kendall(Y, P) == pytest.approx(stats.kendalltau(Y, P)[0])
    # hand value: perfectly monotone -> 1
    assert evaluate.kendall([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)


def test_nan_rows_are_dropped_and_constants_give_nan():
    y = np.append(Y, np.nan)
    p = np.append(P, 0.5)
    assert pearson(y, p) == pytest.approx(stats.pearsonr(Y, P)[0])
    assert math.isnan(pearson(Y, np.ones_like(Y)))


def test_fisher_z_by_hand():
    # z = (atanh(.5) - atanh(.3)) / sqrt(1/97 + 1/97) = (0.549306 - 0.309520) / 0.143592 = 1.66993
    z, p = evaluate.fisher_z_test(0.5, 100, 0.3, 100, "greater")
    assert z == pytest.approx(1.66993, abs=1e-4)
    assert p == pytest.approx(1 - stats.norm.cdf(1.66993), abs=1e-5)
    assert p < 0.05
    z2, p2 = evaluate.fisher_z_test(0.5, 100, 0.3, 100, "two-sided")
    assert z2 == pytest.approx(z) and p2 == pytest.approx(2 * p)
    assert evaluate.fisher_z_test(0.3, 100, 0.5, 100)[1] > 0.5  # a loss is no gain
    with pytest.raises(ValueError, match="more than 3"):
        evaluate.fisher_z_test(0.5, 3, 0.3, 100)


def test_bootstrap_resamples_questions():
    rng = np.random.default_rng(0)
    y = rng.normal(size=200)
    p = y + rng.normal(size=200)
    groups = np.repeat(np.arange(50), 4)
    lo, hi = evaluate.bootstrap_ci(y, p, groups, pearson, samples=200)
    r = pearson(y, p)
    assert lo < r < hi and hi - lo < 0.4
    assert evaluate.bootstrap_ci(y, p, groups, samples=50, seed=3) == evaluate.bootstrap_ci(
        y, p, groups, samples=50, seed=3
    )
    s = evaluate.score(y, p, groups, samples=50)
    assert s["n"] == 200 and s["pearson_lo"] < s["pearson"] < s["pearson_hi"]

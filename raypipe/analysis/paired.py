"""Paired comparisons per question: one system against a baseline on the same questions, with the test named.

For each metric, the questions both systems have a value for are paired; the result gives the two means,
the mean difference (system minus baseline), its percentile bootstrap interval over resampled questions
(:mod:`raypipe.core.stats`, seeded) and p-values of tests chosen by the metric's kind (:data:`MetricKind`):

- ``binary`` (0/1 per question, e.g. exact match): McNemar's exact test, the two-sided binomial test of the
  discordant pairs (questions the system gets right and the baseline wrong, and the reverse) at 1/2 -- the
  sign test; no t test (:func:`mcnemar_p`);
- ``count`` (integers with ties and zeros, e.g. iterations, tokens): the Wilcoxon signed-rank test
  (:func:`signed_rank_p`); no t test;
- ``continuous`` (e.g. F1, seconds): the paired t test (:func:`scipy.stats.ttest_rel`) and the Wilcoxon
  signed-rank test.

The signed-rank test drops zero differences and gives tied absolute differences their mean rank; its p-value
is the two-sided tail of the statistic's distribution over every assignment of signs to the ranks (the exact
distribution given the ties), computed exactly when at most :data:`EXACT_MAX` questions differ and otherwise
estimated from :data:`PERMUTATIONS` random sign flips (seeded; p = (1 + extreme flips) / (1 + flips)). The
``test`` column names which, so every table says how its p-values were computed. scipy's ``wilcoxon`` is
not used: it falls back to a normal approximation as soon as a difference is zero or two are tied, which a
discrete metric almost always has.

Multiple testing: p-values are corrected across a *family*, by default every comparison on one metric within
one group (``by``, e.g. a dataset) -- the systems against the baseline, as pyterrier corrects per measure --
or across the groups given as ``family`` (none: every test of the call is one family), with Holm's step-down
method (default; controls the family-wise error rate) or Benjamini-Hochberg's (controls the false discovery
rate). The t tests and the distribution-free tests are corrected separately (two tests of the same
hypotheses, shown side by side).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, get_args

import numpy as np
import pandas as pd
from scipy import stats

from raypipe.core.config import Correction
from raypipe.core.stats import percentile_interval, resamples

CORRECTIONS: tuple[Correction, ...] = get_args(Correction)  # the setting report.correction
CORRECTION_NAMES: dict[Correction, str] = {"holm": "Holm", "bh": "BH"}  # as tables show them
MIN_PAIRS = 2  # the t test needs two pairs for a variance

MetricKind = Literal["binary", "count", "continuous"]
KINDS: tuple[MetricKind, ...] = get_args(MetricKind)
EXACT_MAX = 400  # the signed-rank test is exact up to this many nonzero differences (a table of n(n+1)+1 sums)
PERMUTATIONS = 20_000  # random sign flips beyond EXACT_MAX
TIE_DECIMALS = 9  # absolute differences equal to this many decimals are tied (float noise breaks no tie)
MCNEMAR = "McNemar exact"
SIGNED_RANK_EXACT = "signed-rank exact"
TEST_NAMES: dict[MetricKind, str] = {"binary": "McNemar", "count": "signed-rank", "continuous": "signed-rank"}

NO_DIFFERENCE = "no question differs: p = 1 by definition"
CONSTANT_DIFFERENCE = "every question differs by the same amount: the t test is degenerate"
TOO_FEW = f"fewer than {MIN_PAIRS} paired questions: no test"


def signed_rank_permutation(permutations: int, seed: int) -> str:
    """The ``test`` name of a signed-rank p-value estimated from random sign flips."""
    return f"signed-rank permutation ({permutations} sign flips, seed {seed})"


@dataclass(frozen=True)
class PairedTest:
    """One comparison of paired values: ``diff`` = system - baseline; ``t_p``: the paired t test's p-value
    (NaN for a discrete metric); ``test``/``test_p``: the distribution-free test and its p-value."""

    n: int
    baseline_mean: float
    system_mean: float
    mean_diff: float
    ci_low: float
    ci_high: float
    t_p: float
    test: str
    test_p: float
    note: str = ""


def paired_test(
    baseline: Sequence[float],
    system: Sequence[float],
    kind: MetricKind = "continuous",
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedTest:
    """Compare ``system`` with ``baseline``, aligned by position (NaN pairs must be removed by the caller),
    with the tests of ``kind`` (module docstring)."""
    a, b = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need two 1-d arrays of one length, got shapes {a.shape} and {b.shape}")
    if kind not in KINDS:
        raise ValueError(f"unknown metric kind {kind!r}; known: {', '.join(KINDS)}")
    _check_kind(np.concatenate([a, b]), kind)
    nan = float("nan")
    n = len(a)
    if n == 0:
        return PairedTest(0, nan, nan, nan, nan, nan, nan, "", nan, TOO_FEW)
    diff = b - a
    low, high = _bootstrap_mean(diff, samples, confidence, seed)
    means = (n, float(a.mean()), float(b.mean()), float(diff.mean()), low, high)
    if n < MIN_PAIRS:
        return PairedTest(*means, nan, "", nan, TOO_FEW)
    if kind == "binary":
        return PairedTest(*means, nan, MCNEMAR, mcnemar_p(a, b), NO_DIFFERENCE if not diff.any() else "")
    test_p, test = signed_rank_p(diff, seed=seed)
    if not diff.any():
        return PairedTest(*means, 1.0 if kind == "continuous" else nan, test, test_p, NO_DIFFERENCE)
    if kind == "count":
        return PairedTest(*means, nan, test, test_p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy warns on degenerate (constant) differences
        t_p = float(stats.ttest_rel(b, a).pvalue)
    constant = np.allclose(diff, diff[0], rtol=1e-9, atol=1e-12)
    return PairedTest(*means, t_p, test, test_p, CONSTANT_DIFFERENCE if constant else "")


def _check_kind(values: np.ndarray, kind: MetricKind) -> None:
    if kind == "binary" and not np.isin(values, (0.0, 1.0)).all():
        raise ValueError(f"a binary metric holds only 0 and 1, got {sorted(set(values.tolist()) - {0.0, 1.0})[:3]}")
    if kind == "count" and not (np.isfinite(values) & (values == np.round(values))).all():
        raise ValueError("a count metric holds only integers")


def mcnemar_p(baseline: np.ndarray, system: np.ndarray) -> float:
    """McNemar's exact test on paired 0/1 values: with b questions only the system gets right and c only the
    baseline, p = min(1, 2 P(X <= min(b, c))) for X ~ Binomial(b + c, 1/2); 1 when no pair is discordant."""
    gained = int(((system == 1) & (baseline == 0)).sum())
    lost = int(((system == 0) & (baseline == 1)).sum())
    if gained + lost == 0:
        return 1.0
    return float(min(1.0, 2 * stats.binom.cdf(min(gained, lost), gained + lost, 0.5)))


def signed_rank_p(
    diff: np.ndarray, seed: int = 0, exact_max: int = EXACT_MAX, permutations: int = PERMUTATIONS
) -> tuple[float, str]:
    """The Wilcoxon signed-rank test's two-sided p-value for paired differences, and the ``test`` name.

    Zero differences are dropped; tied absolute differences (equal to :data:`TIE_DECIMALS` decimals) share
    their mean rank. The statistic is the sum
    of the positive differences' ranks, T+; over the 2^m equally likely sign assignments of the m ranks, p is
    the share with |T+ - E T+| at least the observed one: counted exactly (a table of the distribution, built
    one rank at a time) when m <= ``exact_max``, else estimated from ``permutations`` seeded sign flips.
    """
    nonzero = np.asarray(diff, dtype=float)
    nonzero = nonzero[nonzero != 0]
    m = len(nonzero)
    if m == 0:
        return 1.0, SIGNED_RANK_EXACT
    size = np.round(np.abs(nonzero), TIE_DECIMALS)  # 1.0 - 0.9 and 0.8 - 0.7 are one tie, as on paper
    doubled = np.rint(2 * stats.rankdata(size)).astype(np.int64)  # mean ranks are halves: 2 r is whole
    observed = int(doubled[nonzero > 0].sum())
    centre = doubled.sum() / 2  # E[2 T+]
    distance = abs(observed - centre)
    if m <= exact_max:
        pmf = np.zeros(int(doubled.sum()) + 1)
        pmf[0] = 1.0
        for r in doubled:  # each rank joins T+ with probability 1/2
            shifted = np.zeros_like(pmf)
            shifted[r:] = pmf[:-r]
            pmf = 0.5 * (pmf + shifted)
        sums = np.arange(len(pmf))
        return float(min(1.0, pmf[np.abs(sums - centre) >= distance].sum())), SIGNED_RANK_EXACT
    rng = np.random.default_rng(seed)
    extreme, left = 0, permutations
    while left:
        chunk = min(left, max(1, 2_000_000 // m))
        sums = rng.integers(0, 2, size=(chunk, m)) @ doubled
        extreme += int((np.abs(sums - centre) >= distance).sum())
        left -= chunk
    return (1 + extreme) / (1 + permutations), signed_rank_permutation(permutations, seed)


def _bootstrap_mean(diff: np.ndarray, samples: int, confidence: float, seed: int) -> tuple[float, float]:
    means = np.concatenate([diff[idx].mean(axis=1) for idx in resamples(len(diff), samples, seed)])
    return percentile_interval(means, confidence)


def adjust_pvalues(pvalues: Sequence[float], method: Correction = "holm") -> np.ndarray:
    """Corrected p-values for one family, in the input order; NaNs stay NaN and are not counted in it.

    holm: p_(i) * (m - i + 1), made non-decreasing in rank order; bh: p_(i) * m / i, made non-increasing
    from the largest rank down; both capped at 1 (the values of statsmodels' ``multipletests``).
    """
    if method not in CORRECTIONS:
        raise ValueError(f"unknown correction {method!r}; known: {', '.join(CORRECTIONS)}")
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    m = int(finite.sum())
    if m == 0:
        return out
    order = np.argsort(p[finite], kind="stable")
    ranked = p[finite][order]
    rank = np.arange(1, m + 1)
    if method == "holm":
        adjusted = np.maximum.accumulate(ranked * (m - rank + 1))
    else:
        adjusted = np.minimum.accumulate((ranked * m / rank)[::-1])[::-1]
    corrected = np.empty(m)
    corrected[order] = np.minimum(adjusted, 1.0)
    out[finite] = corrected
    return out


def paired_comparisons(
    values: pd.DataFrame,
    metrics: Mapping[str, MetricKind],
    baseline: str,
    *,
    systems: Sequence[str] | None = None,
    against_each_other: bool = False,
    system_column: str = "system",
    key: str | Sequence[str] = "qid",
    by: Sequence[str] = (),
    family: Sequence[str] | None = None,
    correction: Correction = "holm",
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Every system against ``baseline`` on each metric, per group of ``by``; corrected p-values.

    ``values``: one row per question and system (``key`` columns, ``system_column``, the ``by`` columns and
    the ``metrics`` columns; a null metric value leaves that question out of that metric's pairs).
    ``metrics``: column -> its kind, which chooses the tests. ``systems``: which to compare (default: every
    other system, in order of appearance); ``against_each_other``: also every pair of them, in the same
    families. ``family``: the result columns whose values make one correction family (default: the ``by``
    columns and ``metric``; empty: every test of the call in one family).

    Returns one row per group x metric x comparison: the ``by`` columns, ``metric``, ``baseline``,
    ``system``, the fields of :class:`PairedTest`, ``t_p_adj``, ``test_p_adj``, ``correction`` and
    ``family_size`` (the tests each ``test_p`` was corrected with, itself included).
    """
    keys = [key] if isinstance(key, str) else list(key)
    by = list(by)
    family = [*by, "metric"] if family is None else list(family)
    missing = {*keys, system_column, *by, *metrics} - set(values.columns)
    if missing:
        raise ValueError(f"paired values lack the columns {sorted(missing)}")
    present = list(dict.fromkeys(values[system_column]))
    if baseline not in present:
        raise ValueError(f"baseline {baseline!r} has no values; systems: {present}")
    chosen = [s for s in (systems if systems is not None else present) if s != baseline]
    pairs = [(baseline, s) for s in chosen]
    if against_each_other:
        pairs += list(itertools.combinations(chosen, 2))
    duplicated = values.duplicated([*keys, system_column])
    if duplicated.any():
        raise ValueError(f"{int(duplicated.sum())} rows repeat a question of a system (key {keys})")
    rows = []
    groups = values.groupby(by, sort=False, dropna=False) if by else [((), values)]
    for group, part in groups:
        group_values = dict(zip(by, group if isinstance(group, tuple) else (group,)))
        wide = part.pivot(index=keys, columns=system_column, values=list(metrics))
        for metric, kind in metrics.items():
            for ref, other in pairs:
                pair = _metric_pair(wide, metric, ref, other)
                try:
                    test = paired_test(pair[ref], pair[other], kind, samples, confidence, seed)
                except ValueError as exc:
                    raise ValueError(f"{metric}: {exc}") from None
                rows.append({**group_values, "metric": metric, "baseline": ref, "system": other, **asdict(test)})
    result = pd.DataFrame(rows)
    if result.empty:
        return result

    def adjust(p: pd.Series) -> np.ndarray:
        return adjust_pvalues(p.to_numpy(), correction)

    families = result.groupby(family, sort=False, dropna=False) if family else None
    for column in ("t_p", "test_p"):
        result[f"{column}_adj"] = families[column].transform(adjust) if families else adjust(result[column])
    result["correction"] = correction
    tested = result["test_p"].notna()
    result["family_size"] = tested.groupby(families.ngroup()).transform("sum") if families else int(tested.sum())
    return result


def _metric_pair(wide: pd.DataFrame, metric: str, ref: str, other: str) -> pd.DataFrame:
    """The questions where both systems have a value of ``metric``."""
    if ref not in wide[metric] or other not in wide[metric]:
        return pd.DataFrame({ref: [], other: []}, dtype=float)
    return wide[metric][[ref, other]].astype(float).dropna()


def format_p(p: float) -> str:
    """A p-value for a table: three decimals, or ``<0.001``."""
    if not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def summary_table(result: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """A display copy of :func:`paired_comparisons`' result: the difference with its interval, the raw and
    corrected p-values of the t test and of the distribution-free test, and that test's name."""
    if result.empty:
        return result
    correction = CORRECTION_NAMES[result["correction"].iloc[0]]

    def fixed(value: float) -> str:
        return "–" if not np.isfinite(value) else f"{value:.{digits}f}"

    table = result[list(result.columns[: result.columns.get_loc("n") + 1])].copy()  # by, metric, baseline, system, n
    table["baseline mean"] = result["baseline_mean"].map(fixed)
    table["system mean"] = result["system_mean"].map(fixed)
    table["Δ [CI]"] = [
        f"{fixed(d)} [{fixed(lo)}, {fixed(hi)}]"
        for d, lo, hi in zip(result["mean_diff"], result["ci_low"], result["ci_high"])
    ]
    table["t p"] = result["t_p"].map(format_p)
    table[f"t p ({correction})"] = result["t_p_adj"].map(format_p)
    table["test"] = result["test"]
    table["test p"] = result["test_p"].map(format_p)
    table[f"test p ({correction})"] = result["test_p_adj"].map(format_p)
    table["note"] = result["note"]
    return table

"""Paired comparisons per question: one system against a baseline on the same questions, with the test named.

For each metric, the questions both systems have a value for are paired; the result gives the two means,
the mean difference (system minus baseline), its percentile bootstrap interval over resampled questions
(:mod:`raypipe.core.stats`, seeded), the paired t test's p-value (:func:`scipy.stats.ttest_rel`) and the
Wilcoxon signed-rank test's (:func:`scipy.stats.wilcoxon`, scipy's defaults: zero differences dropped,
exact distribution for small samples), as pyterrier's ``Experiment`` and ranx's ``compare`` report them.

Multiple testing: p-values are corrected across a *family*, every comparison on one metric within one
group (``by``, e.g. a dataset) -- the systems against the baseline, as pyterrier corrects per measure --
with Holm's step-down method (default; controls the family-wise error rate) or Benjamini-Hochberg's
(controls the false discovery rate).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import get_args

import numpy as np
import pandas as pd
from scipy import stats

from raypipe.core.config import Correction
from raypipe.core.stats import percentile_interval, resamples

CORRECTIONS: tuple[Correction, ...] = get_args(Correction)  # the setting report.correction
CORRECTION_NAMES: dict[Correction, str] = {"holm": "Holm", "bh": "BH"}  # as tables show them
MIN_PAIRS = 2  # the t test needs two pairs for a variance

NO_DIFFERENCE = "no question differs: p = 1 by definition"
CONSTANT_DIFFERENCE = "every question differs by the same amount: the t test is degenerate"
TOO_FEW = f"fewer than {MIN_PAIRS} paired questions: no test"


@dataclass(frozen=True)
class PairedTest:
    """One comparison of paired values: ``diff`` = system - baseline."""

    n: int
    baseline_mean: float
    system_mean: float
    mean_diff: float
    ci_low: float
    ci_high: float
    t_p: float
    wilcoxon_p: float
    note: str = ""


def paired_test(
    baseline: Sequence[float], system: Sequence[float], samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> PairedTest:
    """Compare ``system`` with ``baseline``, aligned by position (NaN pairs must be removed by the caller)."""
    a, b = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need two 1-d arrays of one length, got shapes {a.shape} and {b.shape}")
    n = len(a)
    if n == 0:
        nan = float("nan")
        return PairedTest(0, nan, nan, nan, nan, nan, nan, nan, TOO_FEW)
    diff = b - a
    low, high = _bootstrap_mean(diff, samples, confidence, seed)
    means = (n, float(a.mean()), float(b.mean()), float(diff.mean()), low, high)
    if n < MIN_PAIRS:
        return PairedTest(*means, float("nan"), float("nan"), TOO_FEW)
    if not diff.any():
        return PairedTest(*means, 1.0, 1.0, NO_DIFFERENCE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy warns on degenerate (constant) differences
        t_p = float(stats.ttest_rel(b, a).pvalue)
        wilcoxon_p = float(stats.wilcoxon(b, a).pvalue)
    constant = np.allclose(diff, diff[0], rtol=1e-9, atol=1e-12)
    return PairedTest(*means, t_p, wilcoxon_p, CONSTANT_DIFFERENCE if constant else "")


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
    metrics: Sequence[str],
    baseline: str,
    *,
    systems: Sequence[str] | None = None,
    against_each_other: bool = False,
    system_column: str = "system",
    key: str | Sequence[str] = "qid",
    by: Sequence[str] = (),
    correction: Correction = "holm",
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Every system against ``baseline`` on each metric, per group of ``by``; corrected p-values.

    ``values``: one row per question and system (``key`` columns, ``system_column``, the ``by`` columns and
    the ``metrics`` columns; a null metric value leaves that question out of that metric's pairs).
    ``systems``: which to compare (default: every other system, in order of appearance);
    ``against_each_other``: also every pair of them, in the same families.

    Returns one row per group x metric x comparison: the ``by`` columns, ``metric``, ``baseline``,
    ``system``, the fields of :class:`PairedTest`, ``t_p_adj``, ``wilcoxon_p_adj`` and ``correction``.
    """
    keys = [key] if isinstance(key, str) else list(key)
    by = list(by)
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
        for metric in metrics:
            for ref, other in pairs:
                pair = _metric_pair(wide, metric, ref, other)
                test = paired_test(pair[ref], pair[other], samples, confidence, seed)
                rows.append({**group_values, "metric": metric, "baseline": ref, "system": other, **asdict(test)})
    result = pd.DataFrame(rows)
    if result.empty:
        return result
    for column in ("t_p", "wilcoxon_p"):
        result[f"{column}_adj"] = result.groupby([*by, "metric"], sort=False, dropna=False)[column].transform(
            lambda p: adjust_pvalues(p.to_numpy(), correction)
        )
    result["correction"] = correction
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
    """A display copy of :func:`paired_comparisons`' result: the difference with its interval and the
    corrected p-values of both tests as strings, the raw p-values beside them."""
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
    table["Wilcoxon p"] = result["wilcoxon_p"].map(format_p)
    table[f"Wilcoxon p ({correction})"] = result["wilcoxon_p_adj"].map(format_p)
    table["note"] = result["note"]
    return table

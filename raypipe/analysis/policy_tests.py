"""Paired tests of stopping policies against natural stopping, question by question.

The sweep's trade-off table and Stop-RAG's comparison give each policy's means on the test questions. Here each
policy's outcome on every test question (:func:`raypipe.stopping.per_question.tradeoff_outcomes` for the sweep's
rows, :func:`raypipe.stoprag.comparison.comparison_rows`' outcomes for Stop-RAG's) is paired with natural
stopping's on the same question, on the replay's figures: F1 and exact match of the returned answer (EM under the
run's ``agent.metric`` rule, scored from the recorded answers), retrieval iterations (the cost counted to the
decision) and generated tokens (agent + probes). The statistics are :func:`raypipe.analysis.paired.paired_comparisons`':
the mean difference with a percentile bootstrap interval over resampled questions and the tests of each metric's kind
(:data:`KINDS`): McNemar's exact test for EM (0/1), the Wilcoxon signed-rank test (exact, or by seeded sign flips on
many questions) for iterations and tokens (integers), the paired t test and the signed-rank test for F1, corrected
(``report.correction``: Holm or Benjamini-Hochberg) across the policies of one table on each metric. A policy defined on
fewer questions (the heuristic where predictions exist, LLM-Stop's subset) is paired on the questions it has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from raypipe.analysis.paired import (
    CORRECTION_NAMES,
    EXACT_MAX,
    PERMUTATIONS,
    TEST_NAMES,
    MetricKind,
    format_p,
    paired_comparisons,
    summary_table,
)
from raypipe.core.config import ReportConfig
from raypipe.core.tables import frame_markdown
from raypipe.stopping.grid import HeadKey
from raypipe.stopping.heuristic import Predictions, Thresholds
from raypipe.stopping.inputs import SweepInputs
from raypipe.stopping.outputs import SIGNIFICANCE, TRADEOFF
from raypipe.stopping.per_question import policy_labels, tradeoff_outcomes
from raypipe.stopping.tradeoff import PValues

NATURAL = "natural"
METRICS = {"f1": "F1", "em": "EM", "iterations": "iterations", "tokens": "tokens"}  # Outcome field -> shown name
KINDS: dict[str, MetricKind] = {"f1": "continuous", "em": "binary", "iterations": "count", "tokens": "count"}
SHOWN = ("f1", "em", "iterations")  # the metrics whose p-values the policy tables show beside their means
TESTS = {"t": "t_p_adj", "test": "test_p_adj"}  # test -> paired_comparisons' corrected p-value column
STOPRAG_SIGNIFICANCE = "significance"


def policy_tests(outcomes: pd.DataFrame, options: ReportConfig, systems: Sequence[str] | None = None) -> pd.DataFrame:
    """Every controller of ``outcomes`` (one row per controller and question; or only ``systems``) against
    natural stopping on :data:`METRICS` (and each other, with ``report.policy_pairs``):
    :func:`~raypipe.analysis.paired.paired_comparisons`' rows."""
    return paired_comparisons(
        outcomes,
        KINDS,
        NATURAL,
        systems=systems,
        against_each_other=options.policy_pairs,
        system_column="controller",
        key="qid",
        correction=options.correction,
        samples=options.bootstrap_samples,
        confidence=options.confidence,
        seed=options.bootstrap_seed,
    )


def pvalue_column(metric: str, test: str) -> str:
    """The CSV column of a policy table holding ``test``'s corrected p-value on ``metric``: ``f1_t_p_adj``."""
    return f"{metric}_{TESTS[test]}"


def metric_tests(metric: str) -> tuple[str, ...]:
    """The tests (keys of :data:`TESTS`) run on ``metric``: the t test only on a continuous one."""
    return tuple(TESTS) if KINDS[metric] == "continuous" else ("test",)


def cell_label(metric: str) -> str:
    """The policy tables' column of ``metric``'s p-values, naming the tests: ``EM p (McNemar)``."""
    names = {"t": "t", "test": TEST_NAMES[KINDS[metric]]}
    return f"{METRICS[metric]} p ({' / '.join(names[test] for test in metric_tests(metric))})"


def tests_note() -> str:
    """Which test each metric gets, in one sentence."""
    return (
        "F1: paired t test and Wilcoxon signed-rank test; EM (0/1): McNemar's exact test (binomial test of the "
        "questions only one side answers exactly); iterations and tokens (integers): Wilcoxon signed-rank test. "
        f"The signed-rank test drops zero differences, gives ties their mean rank and is exact up to {EXACT_MAX} "
        f"differing questions (beyond: {PERMUTATIONS} seeded random sign flips; the test column says which)"
    )


def table_pvalues(result: pd.DataFrame, labels: Sequence[str], details: str) -> PValues:
    """The tests of ``result`` for the rows of a policy table (``labels``, natural stopping and untested rows
    left empty); ``details`` names the file with the differences and intervals."""
    against_natural = result[result["baseline"] == NATURAL] if not result.empty else result
    lookup = against_natural.set_index(["system", "metric"]) if not result.empty else pd.DataFrame()
    numbers = pd.DataFrame(
        [
            {
                pvalue_column(m, test): _lookup(lookup, label, m, TESTS[test])
                for m in METRICS
                for test in metric_tests(m)
            }
            for label in labels
        ]
    )
    cells = pd.DataFrame([{cell_label(m): _cell(numbers.loc[i], m) for m in SHOWN} for i in range(len(labels))])
    correction = CORRECTION_NAMES[result["correction"].iloc[0]] if not result.empty else "–"
    note = (
        f"p: each policy against natural stopping on the same test questions, {correction}-corrected across the "
        f"table's policies on each metric. {tests_note()}. {details}: the mean differences with their bootstrap "
        "intervals, the raw p-values, the test of each row, tokens."
    )
    return PValues(numbers, cells, note)


def _lookup(lookup: pd.DataFrame, label: str, metric: str, column: str) -> float:
    return float(lookup.loc[(label, metric), column]) if (label, metric) in lookup.index else float("nan")


def _cell(row: pd.Series, metric: str) -> str:
    values = [row[pvalue_column(metric, test)] for test in metric_tests(metric)]
    return "" if np.isnan(values).all() else " / ".join(format_p(p) for p in values)


def significance_markdown(result: pd.DataFrame, title: str, intro: str) -> str:
    """One table per metric: each policy against natural stopping (the display of
    :func:`~raypipe.analysis.paired.summary_table`)."""
    parts = [f"# {title}", intro]
    if result.empty:
        return "\n\n".join([*parts, "No policy to test: the table holds natural stopping only."]) + "\n"
    shown = summary_table(result.assign(metric=result["metric"].map(METRICS)))
    if (result["baseline"] == NATURAL).all():
        shown = shown.drop(columns="baseline").rename(columns={"baseline mean": "natural mean"})
    shown = shown.rename(columns={"system": "policy", "system mean": "policy mean"})
    for metric, part in shown.groupby("metric", sort=False):
        parts += [f"## {metric}", frame_markdown(part.drop(columns="metric"))]
    return "\n\n".join(parts) + "\n"


def significance_intro(result: pd.DataFrame, options: ReportConfig, policies: str) -> str:
    """What the significance tables hold, in one paragraph."""
    n = int(result["n"].max()) if not result.empty else 0
    correction = CORRECTION_NAMES[options.correction]
    return (
        f"{policies} against natural stopping, paired by question on up to {n} test questions. Δ = policy − natural "
        "per question (F1 and EM of the returned answer; iterations: retrieval iterations to the decision; tokens: "
        f"generated tokens, agent + probes): its mean with a {options.confidence:.0%} percentile bootstrap interval "
        f"({options.bootstrap_samples} resamples of the questions, seed {options.bootstrap_seed}). {tests_note()}. "
        f"p-values {correction}-corrected across the policies on each metric (report.correction)"
        + (
            "; every pair of policies is tested too, in the same families (report.policy_pairs)."
            if options.policy_pairs
            else "."
        )
    )


def write_significance(out: Path, stem: str, result: pd.DataFrame, title: str, intro: str) -> tuple[Path, Path]:
    """``out/<stem>.csv`` (the numbers) and ``out/<stem>.md`` (the tables)."""
    csv, md = out / f"{stem}.csv", out / f"{stem}.md"
    result.to_csv(csv, index=False)
    md.write_text(significance_markdown(result, title, intro))
    return csv, md


def sweep_pvalues(
    out: Path,
    table: pd.DataFrame,
    inputs: SweepInputs,
    heads: Mapping[HeadKey, Predictions],
    thresholds: Mapping[tuple, Mapping[str, Thresholds]],
    options: ReportConfig,
) -> PValues:
    """The sweep's trade-off ``table`` rows against natural stopping on the test questions: writes
    ``out/03_significance.csv``/``.md``, returns the p-values for the table's columns."""
    outcomes = tradeoff_outcomes(table, inputs.trajectories, inputs.split_of, heads, thresholds)
    result = policy_tests(outcomes, options)
    intro = significance_intro(result, options, f"Each policy of {TRADEOFF}.md")
    write_significance(out, SIGNIFICANCE, result, "Early stopping: paired tests against natural stopping", intro)
    return table_pvalues(result, policy_labels(table), f"{SIGNIFICANCE}.md")


def stoprag_pvalues(out: Path, rows: Sequence[dict], outcomes: Sequence[dict], options: ReportConfig) -> PValues:
    """Stop-RAG's comparison rows against natural stopping on the test questions: writes
    ``out/significance.csv``/``.md``, returns the p-values for comparison.csv/.md."""
    controllers = [row["controller"] for row in rows]
    systems = [c for c in controllers if not c.startswith(NATURAL)]  # natural on LLM-Stop's questions is natural
    result = policy_tests(pd.DataFrame(outcomes), options, systems)
    intro = significance_intro(result, options, "Each controller of comparison.md")
    write_significance(out, STOPRAG_SIGNIFICANCE, result, "Stop-RAG: paired tests against natural stopping", intro)
    return table_pvalues(result, controllers, f"{STOPRAG_SIGNIFICANCE}.md")

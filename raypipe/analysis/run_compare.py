"""Compare run directories question by question (``raypipe compare``): paired tests against a baseline run.

Each run's ``trajectories/`` gives one row per question: final F1, exact match (not stored: computed here
from the final answer and golden answers under the run's own ``agent.metric`` rule, as F1 was; null where F1
is, a question without golden answers), the retrieval iterations and the cost columns
(:data:`raypipe.core.schema.TRAJECTORY_COSTS`, token counts and times). Runs scored under different
``agent.metric`` rules are refused (their F1 and EM differ by the rule as well as by the answers) unless
``allow_mixed_metrics``. Questions are paired by (dataset, qid) on the questions every run has; a question
whose trajectory ended in an infrastructure failure in any run (:data:`raypipe.analysis.stats.FAILED_STOPS`)
is left out, as every report figure leaves it out. Statistics: :func:`raypipe.analysis.paired.paired_comparisons`
(each metric's tests chosen by its kind: :data:`KINDS`), per dataset and over all datasets; the p-values are
corrected over every test of the comparison together (every run, metric and dataset: one family). The
configuration differences come from the runs' merged configuration trees, as the report's Setup panel reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from raypipe.analysis.blocks import RenderedSection, Table, Text, document_html, document_markdown
from raypipe.analysis.paired import CORRECTION_NAMES, Correction, MetricKind, paired_comparisons, summary_table
from raypipe.analysis.setup_section import _show, lookup, run_tree
from raypipe.analysis.stats import ALL, FAILED_STOPS
from raypipe.core.metrics import exact_match
from raypipe.core.rundir import RunDir, model_notes
from raypipe.core.schema import TRAJECTORIES, TRAJECTORY_COSTS

KEY = ["dataset", "qid"]
# trajectories column (or "em", computed) -> the name the tables show
METRICS = {
    "final_f1": "final F1",
    "em": "EM",
    "n_iterations": "iterations",
    "tokens_generated": "tokens_generated",
    "probe_tokens": "probe_tokens",
    "wall_s": "wall_s",
    **{f.name: f.name for f in TRAJECTORY_COSTS},
}
STORED = [m for m in METRICS if m != "em"]
# each metric's kind, which chooses its tests: EM is 0/1, integer columns are counts, the rest continuous
KINDS: dict[str, MetricKind] = {
    m: "binary" if m == "em" else "count" if pa.types.is_integer(TRAJECTORIES.field(m).type) else "continuous"
    for m in METRICS
}


class CompareError(ValueError):
    """Runs that cannot be compared; the message says why in one line."""


@dataclass
class Comparison:
    labels: list[str]  # one per run, the baseline first
    paths: list[Path]
    result: pd.DataFrame  # paired_comparisons' rows (dataset "all" = every dataset)
    questions: pd.DataFrame  # per run: questions, left out (not shared, failed), compared
    shared: int  # questions compared
    skipped_metrics: list[str]  # no values in some run
    config_diff: pd.DataFrame  # setting, one column per run
    rules: dict[str, str]  # each run's agent.metric (they differ only with allow_mixed_metrics)

    @property
    def baseline(self) -> str:
        return self.labels[0]

    @property
    def mixed_metrics(self) -> str | None:
        """The warning the page and the terminal show when the runs were scored under different rules."""
        if len(set(self.rules.values())) == 1:
            return None
        return f"WARNING: {_rules_named(self.rules)}: F1 and EM differ by the rule as well as by the answers"


def run_values(run: RunDir) -> pd.DataFrame:
    """One row per question: dataset, qid, stop_reason and every compared metric (null where not recorded)."""
    if not run.path.is_dir():
        raise CompareError(f"run directory {run.path} does not exist")
    if not run.has("trajectories"):
        raise CompareError(f"{run.path} is not a run directory: no trajectories/ table (raypipe probe writes it)")
    frame = run.read("trajectories").to_pandas()
    rule = run.metric_rule()  # the rule final_f1 used
    answers = frame["final_answer"].astype(object).where(frame["final_answer"].notna(), None)
    scored = frame["final_f1"].notna()  # unscored (no golden answers, or failed): EM null, as F1 is
    frame["em"] = [
        exact_match(a, list(g), rule) if s else None for a, g, s in zip(answers, frame["golden_answers"], scored)
    ]
    for column in STORED:
        if column not in frame:  # a run written before the cost columns existed
            frame[column] = None
    return frame[[*KEY, "stop_reason", *METRICS]]


def run_labels(paths: Sequence[Path]) -> list[str]:
    """Each run's folder name, or the path as given where two runs share a name."""
    names = [Path(p).name for p in paths]
    return [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths)]


def _rules_named(rules: dict[str, str]) -> str:
    return (
        "the runs were scored under different agent.metric rules ("
        + ", ".join(f"{label}: {rule}" for label, rule in rules.items())
        + ")"
    )


def compare_runs(
    paths: Sequence[str | Path],
    correction: Correction = "holm",
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    allow_mixed_metrics: bool = False,
) -> Comparison:
    """Compare every run with the first (the baseline) on the questions they share; runs scored under
    different ``agent.metric`` rules only with ``allow_mixed_metrics``."""
    paths = [Path(p) for p in paths]
    if len({p.resolve() for p in paths}) != len(paths) or len(paths) < 2:
        raise CompareError(f"compare needs at least two different run directories, got {[str(p) for p in paths]}")
    labels = run_labels(paths)
    runs = [RunDir(p) for p in paths]
    frames = {label: run_values(run) for label, run in zip(labels, runs)}
    rules = {label: run.metric_rule() for label, run in zip(labels, runs)}
    if len(set(rules.values())) > 1 and not allow_mixed_metrics:
        raise CompareError(
            f"{_rules_named(rules)}, so their F1 and EM are not comparable; rescore one run "
            "or pass --allow-mixed-metrics to compare anyway"
        )
    shared, questions = _shared_questions(frames)
    values = pd.concat([f.assign(system=label).merge(shared, on=KEY) for label, f in frames.items()], ignore_index=True)
    usable = [m for m in METRICS if all(values.loc[values["system"] == label, m].notna().any() for label in labels)]
    values = values.astype(dict.fromkeys(usable, float))
    if values["dataset"].nunique() > 1:
        values = pd.concat([values, values.assign(dataset=ALL)], ignore_index=True)
    result = paired_comparisons(
        values,
        {m: KINDS[m] for m in usable},
        labels[0],
        key=KEY,
        by=["dataset"],
        family=(),
        correction=correction,
        samples=samples,
        confidence=confidence,
        seed=seed,
    )
    result["metric"] = result["metric"].map(METRICS)
    return Comparison(
        labels,
        paths,
        result,
        questions,
        len(shared),
        [METRICS[m] for m in METRICS if m not in usable],
        config_differences(paths, labels),
        rules,
    )


def _shared_questions(frames: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The (dataset, qid) pairs every run has and none failed on, and the per-run question counts."""
    indexes = [pd.MultiIndex.from_frame(f[KEY]) for f in frames.values()]
    common = indexes[0]
    for index in indexes[1:]:
        common = common.intersection(index)
    if common.empty:
        held = "; ".join(
            f"{label}: {len(f)} on {', '.join(sorted(f['dataset'].unique()))}" for label, f in frames.items()
        )
        raise CompareError(
            f"the runs share no questions (by dataset and qid) -- {held}; compare runs of the same questions"
        )
    failed = pd.MultiIndex.from_frame(
        pd.concat([f.loc[f["stop_reason"].isin(FAILED_STOPS), KEY] for f in frames.values()])
    )
    kept = common.difference(failed)
    if kept.empty:
        raise CompareError(
            f"every one of the {len(common)} shared questions failed (an engine, retrieval or internal error, a query "
            "crash) in some run: nothing to compare"
        )
    rows = [
        {
            "run": label,
            "questions": len(f),
            "not in every run": len(f) - len(common),
            "failed in some run": len(common) - len(kept),
            "compared": len(kept),
            "datasets": ", ".join(sorted(f["dataset"].unique())),
        }
        for label, f in frames.items()
    ]
    return kept.to_frame(index=False), pd.DataFrame(rows)


def config_differences(paths: Sequence[Path], labels: Sequence[str]) -> pd.DataFrame:
    """Every setting whose value differs between the runs (the merged trees of the Setup panel)."""
    trees = [run_tree(p)[0] for p in paths]
    keys = sorted(set().union(*(_flat_keys(t) for t in trees)))
    rows = []
    for key in keys:
        values = [lookup(tree, {}, key) for tree in trees]
        if any(v != values[0] for v in values[1:]):
            rows.append({"setting": key, **{label: _show(v) for label, v in zip(labels, values)}})
    return pd.DataFrame(rows, columns=["setting", *labels])


def _flat_keys(tree: Any, prefix: str = "") -> set[str]:
    """Dotted keys of a configuration tree's leaves (a list is one leaf)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix} if prefix else set()
    return set().union(
        *(_flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}"} for k, v in tree.items())
    )


# ---------------------------------------------------------------- the page


def comparison_tables(comparison: Comparison) -> list[Table]:
    """One table of paired comparisons per dataset (every dataset first)."""
    result = comparison.result
    correction = CORRECTION_NAMES[result["correction"].iloc[0]]
    table = summary_table(result).drop(columns="baseline")
    table = table.rename(
        columns={"system": "run", "baseline mean": f"{comparison.baseline} mean", "system mean": "run mean"}
    )
    t_tests = int(result["t_p"].notna().sum())
    note = (
        f"Per question, run minus {comparison.baseline}: Δ with its percentile bootstrap interval over resampled "
        "questions. test: EM (0/1) by McNemar's exact test; iterations and token counts (integers) by the "
        "Wilcoxon signed-rank test; F1 and times by the paired t test and the signed-rank test. The signed-rank "
        "test drops zero differences, gives ties their mean rank and is exact, or estimated from seeded random "
        f"sign flips where its name says so. p-values {correction}-corrected over every test of this comparison "
        f"together (every run, metric and dataset: {int(result['family_size'].iloc[0])} tests; the {t_tests} t "
        "tests separately)."
    )
    order = [ALL, *sorted(d for d in table["dataset"].unique() if d != ALL)]
    return [
        Table(
            f"{'All datasets' if d == ALL else d}: against {comparison.baseline}",
            table[table["dataset"] == d].drop(columns="dataset"),
            note=note,
        )
        for d in order
        if (table["dataset"] == d).any()
    ]


def comparison_sections(comparison: Comparison) -> list[RenderedSection]:
    counts = Text(
        f"{comparison.shared} questions compared, paired by dataset and qid; baseline "
        f"{comparison.baseline} ({comparison.paths[0]})."
    )
    notes = [Text(f"{note}.", "note") for note in model_notes(RunDir(path) for path in comparison.paths)]
    blocks = [*notes, counts, Table("Questions per run", comparison.questions)]
    if comparison.mixed_metrics:
        blocks.insert(0, Text(f"{comparison.mixed_metrics}.", "note"))
    if comparison.skipped_metrics:
        blocks.append(Text(f"Not compared (no values in some run): {', '.join(comparison.skipped_metrics)}.", "note"))
    diff = comparison.config_diff
    settings = (
        Table(
            f"{len(diff)} settings differ",
            diff,
            note="From each run's config.yaml, overlaid with the "
            "sections of train.yaml, sweep.yaml and stoprag.yaml (the report's Setup panel).",
        )
        if not diff.empty
        else Text("The runs' configurations are the same.")
    )
    return [
        RenderedSection("questions", "Questions", blocks),
        RenderedSection("paired", "Paired comparisons", list(comparison_tables(comparison))),
        RenderedSection("config", "Configuration differences", [settings]),
    ]


def comparison_figures(comparison: Comparison) -> dict[str, float]:
    """The headline figures experiment tracking logs: questions compared and, over every dataset, each run's
    mean difference and corrected p-values per metric (``<run>.<metric>.mean_diff``, ``...t_p_adj`` where a
    t test ran, ``...test_p_adj``)."""
    result = comparison.result
    overall = result[result["dataset"] == (ALL if (result["dataset"] == ALL).any() else result["dataset"].iloc[0])]
    figures = {"questions_compared": float(comparison.shared)}
    for row in overall.itertuples(index=False):
        for column in ("mean_diff", "t_p_adj", "test_p_adj"):
            if pd.notna(getattr(row, column)):
                figures[f"{row.system}.{row.metric}.{column}"] = float(getattr(row, column))
    return figures


def write_comparison(comparison: Comparison, out: Path) -> tuple[Path, Path]:
    """``out/index.html`` (one page), ``out/compare.md`` and the numbers in ``out/tables/*.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    tables = out / "tables"
    tables.mkdir(exist_ok=True)
    comparison.result.to_csv(tables / "paired.csv", index=False)
    comparison.questions.to_csv(tables / "questions.csv", index=False)
    comparison.config_diff.to_csv(tables / "config_diff.csv", index=False)
    sections = comparison_sections(comparison)
    title = f"raypipe compare: {' vs '.join(comparison.labels[1:])} against {comparison.baseline}"
    subtitle = " · ".join(str(p.resolve()) for p in comparison.paths)
    html, md = out / "index.html", out / "compare.md"
    html.write_text(document_html(title, subtitle, sections, out))
    md.write_text(document_markdown(title, sections, out))
    return html, md

"""The compare job: paired per-question tests of runs against a baseline run (:mod:`raypipe.analysis.run_compare`),
printed as tables and written as one HTML page. Needs no Ray."""

from __future__ import annotations

import sys
from pathlib import Path

from raypipe.analysis.blocks import Table, table_markdown
from raypipe.analysis.paired import CORRECTIONS
from raypipe.analysis.run_compare import (
    CompareError,
    compare_runs,
    comparison_figures,
    comparison_tables,
    write_comparison,
)
from raypipe.analysis.tracking import Headline, StageTracker, run_tracking
from raypipe.core.config import ConfigError
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.rundir import RunDir
from raypipe.runtime.stage_main import log_finished, print_model_note, tracking_or_exit

DESCRIPTION = """Compare runs question by question against a baseline run: paired exact and t tests.

On the questions every run has (by dataset and qid; the others are counted and left out, as are
questions a run failed on), compares final F1, exact match, iterations and the cost columns (tokens,
times) of each run with the baseline's, per dataset and over all: the means, the mean difference with a
bootstrap interval and p-values -- McNemar's exact test for exact match, the Wilcoxon signed-rank test
(exact, or seeded sign flips on many questions) for iterations and token counts, the paired t test and the
signed-rank test for F1 and times -- with Holm (or Benjamini-Hochberg) correction over every test of the
comparison (runs x metrics x datasets). Runs scored under different agent.metric rules are refused unless
--allow-mixed-metrics. Prints the tables and writes BASELINE/compare/index.html (plus compare.md and tables/*.csv)
with the settings that differ between the runs' configs. Bootstrap options: --set report.bootstrap_samples=N,
report.bootstrap_seed, report.confidence; the correction: --correction or report.correction. With tracking on
(--set tracking.mlflow_uri=PATH_OR_URL, or the baseline run's config.yaml) the comparison is logged to MLflow,
in the baseline run's experiment.
"""


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("runs", metavar="RUN_DIR", type=Path, nargs="+", help="the run directories to compare")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="the run the others are compared with (default: the first RUN_DIR; added if not listed)",
    )
    parser.add_argument(
        "--correction",
        choices=CORRECTIONS,
        default=None,
        help="multiple-testing correction: holm (family-wise error) or bh (Benjamini-Hochberg, "
        "false discovery rate); default: report.correction (holm)",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: BASELINE/compare)")
    parser.add_argument(
        "--allow-mixed-metrics",
        action="store_true",
        help="compare runs scored under different agent.metric rules (refused by default: their F1 and EM "
        "differ by the rule as well as by the answers); the page and the terminal say so",
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)
    options = config.report
    baseline = args.baseline or args.runs[0]
    runs = [baseline, *(r for r in args.runs if r.resolve() != baseline.resolve())]
    correction = args.correction or options.correction
    settings = tracking_or_exit(run_tracking, config.tracking, baseline)  # the baseline's own when not set here
    tracker = tracking_or_exit(StageTracker.open, settings, baseline, "compare")
    try:
        comparison = compare_runs(
            runs,
            correction,
            options.bootstrap_samples,
            options.confidence,
            options.bootstrap_seed,
            args.allow_mixed_metrics,
        )
    except (CompareError, ConfigError) as exc:
        sys.exit(f"error: {exc}")
    if comparison.mixed_metrics:
        print(comparison.mixed_metrics, file=sys.stderr)
    print(f"{comparison.shared} questions compared against {comparison.baseline}\n")
    for table in (Table("Questions per run", comparison.questions), *comparison_tables(comparison)):
        print(table_markdown(table), end="\n\n")
    if comparison.skipped_metrics:
        print(f"not compared (no values in some run): {', '.join(comparison.skipped_metrics)}")
    if not comparison.config_diff.empty:
        print(f"settings that differ: {', '.join(comparison.config_diff['setting'])}")
    html, md = write_comparison(comparison, args.out or baseline / "compare")
    print_model_note(*(RunDir(run) for run in runs))
    print(f"(page: {html})")
    params = {
        "compare": {
            "baseline": str(baseline.resolve()),
            "runs": [str(r.resolve()) for r in runs],
            "correction": correction,
            "allow_mixed_metrics": args.allow_mixed_metrics,
        }
    }
    headline = Headline(comparison_figures(comparison), [html, md, html.parent / "tables"])
    log_finished(tracker, config, headline, params)

"""What experiment tracking (:mod:`raypipe.analysis.tracking`) logs of the probe, features and train stages
besides their configuration: their headline figures and tables. (The sweep, Stop-RAG, report and compare
stages say it in their own modules.)"""

from __future__ import annotations

import pandas as pd

from raypipe.agents.probe_run import INFO_FILE
from raypipe.analysis.probe_summary import summarize
from raypipe.analysis.tracking import Headline
from raypipe.core.rundir import RunDir
from raypipe.features.correlation import correlation_table


def probe_headline(run: RunDir, written: int) -> Headline:
    """The trajectories written now and, per dataset, the whole run's questions, mean iterations and final F1;
    the config and the run's info file."""
    metrics = {"new_trajectories": float(written)}
    for row in summarize(run):
        for key in ("questions", "mean_iterations", "final_f1"):
            metrics[f"{row['dataset']}.{key}"] = float(row[key])
    return Headline(metrics, [run.path / "config.yaml", run.path / INFO_FILE])


def features_headline(run: RunDir, rows: int) -> Headline:
    """The feature rows and every signal's Pearson r with P_i and U_i (the table the stage prints)."""
    table = correlation_table(run.read("features"))
    metrics = {"feature_rows": float(rows)}
    for row in table:
        metrics.update({f"{name}.{row['signal']}": row[name] for name in ("r_P", "r_U") if row[name] is not None})
    return Headline(metrics, tables={"feature_correlations.csv": pd.DataFrame(table)})


def train_headline(run: RunDir, summary: dict) -> Headline:
    """Questions, rows and time; the predictors' tables (Tables 3 and 4, the cross-encoders)."""
    metrics = {key: float(summary[key]) for key in ("questions", "train_questions", "rows", "seconds")}
    return Headline(metrics, [run.path / "predictions" / "tables"])

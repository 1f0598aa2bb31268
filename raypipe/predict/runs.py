"""The train stage's inputs: a run's tables, stacked under the training run's when there is one."""

from __future__ import annotations

import pandas as pd

from raypipe.core.rundir import RunDir
from raypipe.predict.splits import check_disjoint


def read_runs(run: RunDir, train_run: RunDir | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, set[str]]:
    """iterations, trajectories and features of the run (and of the training run, stacked), and the
    training run's qids (empty without one); a question in both runs is an error."""
    runs = [run] if train_run is None else [train_run, run]
    tables = [[r.read(name).to_pandas() for r in runs] for name in ("iterations", "trajectories", "features")]
    train_qids: set[str] = set()
    if train_run is not None:
        train_qids = set(tables[1][0]["qid"].astype(str))
        check_disjoint(train_qids, tables[1][1]["qid"], f"the training run {train_run.path}", f"the run {run.path}")
    iterations, trajectories, features = (pd.concat(t, ignore_index=True) for t in tables)
    return iterations, trajectories, features, train_qids

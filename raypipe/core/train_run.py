"""``--train-run``: the run whose questions train, sweep and stoprag train and tune on (``RunConfig.train_run``).

The seed paper trains its predictors on the training splits of the datasets and evaluates on their dev
splits (§5.3); in raypipe the two are two run directories, one probed on training questions and one on
evaluation questions. Without a training run every stage cross-fits within its one run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from raypipe.core.config import RunConfig
from raypipe.core.rundir import RunDir

HELP = (
    "a run directory of training questions: train (and tune) on its questions, evaluate on RUN_DIR's, the seed "
    "paper's train/dev protocol (also --set train_run=PATH); default: cross-fitting within RUN_DIR"
)


def add_train_run_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-run", metavar="TRAIN_RUN_DIR", default=None, help=HELP)


def resolve_train_run(config: RunConfig, argument: str | None, run: RunDir) -> RunDir | None:
    """The training run of ``--train-run`` (else ``config.train_run``), recorded in ``config.train_run``."""
    path = argument or config.train_run
    if not path:
        return None
    train = RunDir(path)
    if not train.path.is_dir():
        raise SystemExit(f"error: training run {train.path} does not exist")
    if Path(train.path).resolve() == Path(run.path).resolve():
        raise SystemExit("error: --train-run names the run itself; omit it to cross-fit within one run")
    config.train_run = str(Path(train.path).resolve())
    return train


class StackedRun(RunDir):
    """A training run and a run read as one: every table is the training run's rows, then the run's.

    Its path is the run's (outputs go there). Both runs' tables share their schemas (raypipe.core.schema).
    """

    def __init__(self, train: RunDir, run: RunDir):
        super().__init__(run.path)
        self.runs = (train, run)

    def has(self, name: str) -> bool:
        return all(r.has(name) for r in self.runs)

    def read(self, name: str, columns: list[str] | None = None):
        import pyarrow as pa

        return pa.concat_tables([r.read(name, columns) for r in self.runs], promote_options="default")

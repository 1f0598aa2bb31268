"""The train job: driver and entry point (``raypipe train``, ``python jobs/train.py``)."""

from __future__ import annotations

import logging

from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.predict.docs import doc_lookup_for
from raypipe.predict.pipeline import run_train
from raypipe.runtime.cluster import init_ray

DESCRIPTION = """Train the P_i / U_i predictors of a run: cross-encoders on Ray Train, the windowed head, Tables 3-4.

Reads RUN_DIR/iterations/, trajectories/ and features/ (jobs/features.py). Fine-tunes one cross-encoder
per relation x target x fold (k-fold by question) with Ray Train, fits the windowed MLP head for every
signal family x target x window out of fold, evaluates on held-out questions (Pearson r, Kendall tau,
Fisher z vs w=1, bootstrap intervals) and writes RUN_DIR/predictions/ (predictions table, tables/,
curves/), RUN_DIR/prediction_grid/ and the predictor bundle RUN_DIR/models/ (raypipe/predict/README.md).
The run's own config.yaml is the base configuration unless --config names another; settings: train.*.
"""


log = logging.getLogger(__name__)


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with iterations/ and features/")
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    config = run_config_from_args(args, run.path)

    import ray

    init_ray(config, log_to_driver=False)
    try:
        summary = run_train(run, config.train, doc_lookup_for(config), seed=config.seed)
    except (RunDirError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        ray.shutdown()
    run.write_config(config, "train")

    tables = run.path / "predictions" / "tables"
    print(f"\n{summary['questions']} questions, {summary['rows']} rows, {summary['seconds']:.0f} s in all\n")
    for name in ("crossencoders.md", "table3_signal_groups.md", "table4_unsup_sources.md"):
        print((tables / name).read_text())
    print(f"(tables in {tables}; bundle in {run.path / 'models'})")

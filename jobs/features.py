"""Trajectory signals (QPP, RBO, SBERT similarity, probe confidence) for a run: RUN_DIR/features/.

Reads RUN_DIR/iterations/ and RUN_DIR/trajectories/, groups the iterations by trajectory and runs the
signal extractor on a Ray Data actor pool (each actor holds the sentence encoder and the run's retrieval
index). Writes RUN_DIR/features/ (one row per qid x iteration; columns: raypipe.schema.FEATURES), then
prints each signal's Pearson r with P_i and U_i and saves that table as RUN_DIR/feature_correlations.csv.
The run's own config.yaml is the base configuration (its retrieval index) unless --config names another.
"""

from __future__ import annotations

import logging

from raypipe.features.correlation import correlation_table, format_table, write_csv
from raypipe.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.raycluster import init_ray
from raypipe.rundir import RunDir, RunDirError
from raypipe.stages.features import run_features

log = logging.getLogger("jobs.features")


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by jobs/probe.py")
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    config = run_config_from_args(args, run.path)

    import ray

    init_ray(config, log_to_driver=True)
    try:
        rows = run_features(run, config)
    except RunDirError as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        ray.shutdown()
    run.write_config(config, "features")

    table = correlation_table(run.read("features"))
    path = write_csv(table, run.path / "feature_correlations.csv")
    print(f"\n{rows} feature rows -> {run.table_dir('features')}\n")
    print(format_table(table))
    print(f"\n(saved to {path})")


if __name__ == "__main__":
    main()

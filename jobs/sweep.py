"""Sweep prediction-guided early stopping on Ray Tune: thresholds x variants x heads, Figure 5.

Reads RUN_DIR/iterations/, trajectories/ (jobs/probe.py) and predictions/ (+ prediction_grid/,
jobs/train.py). Replays the seed paper's 4-state heuristic over the θ_P x θ_U grid for every named
variant and prediction head (prediction_grid, plus head refits with other training settings,
stopping.refits) as a Ray Tune experiment (one trial per head; TensorBoard:
`tensorboard --logdir RUN_DIR/stopping/tune`), chooses thresholds on validation questions and reports
them on test questions next to natural stopping and Cap@k. Writes RUN_DIR/stopping/: 01_tradeoff.md/.csv,
02_figure5.png, selected.json (for the online controller), data/ (grid, selections, Pareto front), tune/.
The run's own config.yaml is the base configuration unless --config names another; settings: stopping.*.
"""

from __future__ import annotations

from raypipe.control.stage import FIGURE, TRADEOFF, check_inputs, run_sweep
from raypipe.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.raycluster import init_ray
from raypipe.rundir import RunDir, RunDirError


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with iterations/ and predictions/")
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    config = run_config_from_args(args, run.path)
    try:
        check_inputs(run)
    except RunDirError as exc:
        raise SystemExit(f"error: {exc}") from None

    import ray

    init_ray(config, log_to_driver=False)
    try:
        report = run_sweep(run, config.stopping, train=config.train, seed=config.seed)
    except (RunDirError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        ray.shutdown()
    run.write_config(config, "sweep")

    q = report.selected["questions"]
    print(
        f"\n{q['val']} validation / {q['test']} test questions, {report.seconds:.0f} s; left out: {report.excluded or 'none'}\n"
    )
    print((report.out_dir / f"{TRADEOFF}.md").read_text())
    print(
        f"(tables, {FIGURE} and selected.json in {report.out_dir}; TensorBoard: tensorboard --logdir {report.out_dir / 'tune'})"
    )


if __name__ == "__main__":
    main()

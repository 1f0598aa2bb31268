"""Train and evaluate Stop-RAG (Q(lambda) value-based stopping) and the LLM-Stop baseline on a run: RUN_DIR/stoprag/.

Trains the Q-network with Ray Train on the run's training questions, tunes its margin threshold on the
validation questions, and compares natural stopping, Cap@k, the 4-state heuristic (when predictions/
exists), Stop-RAG and LLM-Stop (the engine asked to STOP or CONTINUE) on the test questions:
RUN_DIR/stoprag/comparison.csv, .md and .png. Options are the ``stoprag`` section of the config
(``--set stoprag.target=mc``, ``--set stoprag.epochs=5``). The run's own config.yaml is the base
configuration unless --config names another.
"""

from __future__ import annotations

import logging
import sys

from raypipe.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.raycluster import init_ray
from raypipe.rundir import RunDir, RunDirError

log = logging.getLogger("stoprag")


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by jobs/probe.py")
    parser.add_argument("--no-llm-stop", action="store_true", help="skip the LLM-Stop baseline (it runs the engine)")
    parser.add_argument("--ablation", nargs="*", default=[], choices=["qlambda", "mc", "q0", "binary"],
                        help="also train these target types (the paper's ablation) and add them to the comparison")
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    if not run.path.is_dir():
        sys.exit(f"error: run directory {run.path} does not exist")
    config = run_config_from_args(args, run.path)

    import ray

    from raypipe.control.stoprag_stage import run_stoprag

    init_ray(config, log_to_driver=True)
    try:
        report = run_stoprag(run, config, llm_stop=False if args.no_llm_stop else None, ablation=args.ablation)
    except (RunDirError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    run.write_config(config, "stoprag")
    log.info("questions %s, left out %s, %.0f s; wrote %s", report.splits, report.excluded or "none", report.seconds, report.out)
    print((report.out / "comparison.md").read_text())


if __name__ == "__main__":
    main()

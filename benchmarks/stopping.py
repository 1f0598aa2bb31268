"""Benchmark of online early stopping: the same questions run naturally and with the online controller.

The controller (raypipe.stopping.online) loads the predictor bundle of RUN_DIR (RUN_DIR/models, from
jobs/train.py) and stops trajectories in flight with the seed paper's 4-state heuristic, so the saving
is real compute. Both runs use the config's engine and the in-process retriever, each on a fresh
engine (engine start is reported apart from wall time, and no run inherits the other's prefix cache).

Questions: the first --limit questions per dataset that RUN_DIR's trajectories do not contain (the
bundle's heads were fit on those), so the controller is measured on questions its predictors never saw.
Thresholds: --which paper (config stopping.theta_p/theta_u/variant; default the paper's 0.3/0.2), or
faithful / best (RUN_DIR/stopping/selected.json from jobs/sweep.py).

It prints, per run: questions, wall time, generated tokens (agent + probes), mean retrieval
iterations, mean final F1 and stop reasons; then tokens and wall time saved and the share of natural F1.

    python benchmarks/stopping.py RUN_DIR [--limit N] [--which paper|faithful|best] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter

from raypipe.core.config import DEFAULT_PRESET, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import load_datasets

log = logging.getLogger("benchmarks.stopping")


def unseen_questions(config: RunConfig, run: RunDir, limit: int):
    """The first ``limit`` questions per dataset that the run (and so the bundle) has not seen."""
    seen = (
        set(run.read("trajectories", columns=["qid"]).column("qid").to_pylist()) if run.has("trajectories") else set()
    )
    picked, per_dataset = [], Counter()
    for q in load_datasets(config.data.datasets, None):
        if q.qid not in seen and per_dataset[q.dataset] < limit:
            picked.append(q)
            per_dataset[q.dataset] += 1
    return picked


def run_once(name: str, config: RunConfig, questions, retriever, controller) -> dict:
    from raypipe.stages.probe import GenerateStage

    log.info("%s: starting an engine", name)
    stage = GenerateStage(config, retriever, controller=controller)
    started = time.perf_counter()
    outputs = stage.run(questions)
    wall = time.perf_counter() - started
    stage.close()
    trajs = [o.trajectory for o in outputs]
    n = len(trajs)
    log.info("%s: %d trajectories in %.1f s", name, n, wall)
    return {
        "run": name,
        "questions": n,
        "engine_start_s": stage.engine_start_s,
        "wall_s": wall,
        "tokens": sum((t["tokens_generated"] or 0) + (t["probe_tokens"] or 0) for t in trajs),
        "iterations": sum(t["n_iterations"] or 0 for t in trajs) / n,
        "f1": sum(t["final_f1"] or 0.0 for t in trajs) / n,
        "stops": Counter(t["stop_reason"] for t in trajs),
    }


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory with the predictor bundle under models/")
    parser.add_argument("--limit", type=int, default=8, help="questions per dataset (default 8)")
    parser.add_argument(
        "--which", choices=["paper", "faithful", "best"], default="paper", help="thresholds (see above)"
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    if args.config == DEFAULT_PRESET and (run.path / "config.yaml").exists():
        args.config = str(run.path / "config.yaml")
    config = config_from_args(args)

    from raypipe.retrieval import LocalRetriever, encoder_spec, search_params
    from raypipe.stages.index import ensure_index
    from raypipe.stopping.online import OnlineController, controller_from_path

    if args.which == "paper":
        controller = controller_from_path(run.path, config)
    else:
        controller = OnlineController.from_selected(
            run.path / "stopping" / "selected.json", run.path / "models", args.which, config
        )
    questions = unseen_questions(config, run, args.limit)
    if not questions:
        sys.exit("error: no questions left that the run has not seen")
    retriever = LocalRetriever.open(
        ensure_index(config, use_ray=False), encoder_spec(config.retrieval), search_params(config.retrieval)
    )
    natural = run_once("natural", config, questions, retriever, None)
    stopped = run_once("controller", config, questions, retriever, controller)

    th = ", ".join(f"{ds}: θ_P={t.theta_p:g} θ_U={t.theta_u:g}" for ds, t in controller.thresholds.items())
    print(f"\n{len(questions)} unseen questions ({', '.join(config.data.datasets)}), model {config.engine.model} on "
          f"{config.engine.backend}; controller {args.which} ({th}; {controller.options})\n")  # fmt: skip
    head = f"{'run':<12}{'questions':>10}{'engine start s':>16}{'wall s':>9}{'tokens':>9}{'iterations':>12}{'F1':>8}  stop reasons"
    print(head)
    print("-" * len(head))
    for r in (natural, stopped):
        stops = ", ".join(f"{k} {v}" for k, v in sorted(r["stops"].items()))
        print(f"{r['run']:<12}{r['questions']:>10}{r['engine_start_s']:>16.1f}{r['wall_s']:>9.1f}{r['tokens']:>9}"
              f"{r['iterations']:>12.3f}{r['f1']:>8.3f}  {stops}")  # fmt: skip
    print()
    print(f"tokens saved: {1 - stopped['tokens'] / max(natural['tokens'], 1):.1%}")
    print(f"wall time saved: {1 - stopped['wall_s'] / natural['wall_s']:.1%}")
    print(f"iterations: {stopped['iterations'] / max(natural['iterations'], 1e-9) - 1:+.1%}")
    share = stopped["f1"] / natural["f1"] if natural["f1"] else float("nan")
    print(f"F1: {stopped['f1']:.3f} vs {natural['f1']:.3f} natural ({share:.1%} of natural)")


if __name__ == "__main__":
    main()

"""The online controller in the batch job (issue 44): ``raypipe probe --controller BUNDLE`` against the same job
without it, on the same questions: the wall-clock it saves against the iterations it saves, and what a decision
costs against an iteration's engine time.

    python benchmarks/controller_probe.py --bundle RUN_OR_BUNDLE --out runs/bench/controller
        [--limit 20] [--repeats 3] [--set stopping.theta_p=0.3 ...]

``--bundle`` is a predictor bundle (or a run directory with one under ``models/``) trained on the agent that runs
(``raypipe train`` on a training-split run of it). Each repeat runs both jobs in a fresh run directory, in
alternating order (natural first, then the controller first, ...), on the dev split's first ``--limit`` questions
of each dataset (``data.limit``; all of them without it), with the preset's settings and ``--set``'s. For each
job: the command's wall seconds, the probe stage's ``generation_seconds`` (probe_info.yaml: the generation actors'
start and every trajectory, what a controller can shorten) and, of it, what came after the engines' start; the
retrieval iterations, the final F1, and with the controller its decisions, their mean and median seconds (the mean
holds the first decisions' wait for the bundle to load) and the mean engine seconds of an iteration (the engine
time of its requests, summed: turn, probe, forced answer). The table shows medians and per-repeat ranges; the
savings line divides the wall saved by the iterations saved (1.0: the wall falls as fast as the iterations).
Prints the CPU model and its flags first. Rerunning with the same ``--out`` reuses the jobs already finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import yaml

from raypipe.core.machine import cpu_description
from raypipe.core.rundir import RunDir

JOBS = ("natural", "controller")
RESULT_FILE = "bench.json"


def run_job(job: str, folder: Path, bundle: Path, limit: int | None, sets: list[str]) -> dict:
    """One probe job's figures (its wall kept in ``folder``/bench.json, so a rerun reuses a finished job)."""
    done = folder / RESULT_FILE
    if done.exists():
        return {**json.loads(done.read_text()), **job_figures(RunDir(folder / "run"))}
    args = [sys.executable, "-m", "raypipe", "probe", "--out", str(folder / "run"), "--set", "data.split=dev"]
    args += ["--set", f"data.limit={'null' if limit is None else limit}"]
    args += [arg for item in sets for arg in ("--set", item)]
    if job == "controller":
        args += ["--controller", str(bundle)]
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (folder / "probe.log").open("w") as log:
        code = subprocess.call(args, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"error: {' '.join(args[2:])} failed ({code}); see {folder / 'probe.log'}")
    done.write_text(json.dumps({"job": job, "wall_s": wall}))
    return {"job": job, "wall_s": wall, **job_figures(RunDir(folder / "run"))}


def job_figures(run: RunDir) -> dict:
    """What one finished probe run shows: its generation time, iterations, F1 and decision cost."""
    info = yaml.safe_load((run.path / "probe_info.yaml").read_text())
    engine_start = max(e.get("actor_start_seconds") or 0.0 for e in info.get("engines") or [{}])
    trajectories = run.read("trajectories", ["n_iterations", "final_f1"])
    iterations = run.read("iterations", ["iteration", "engine_s", "decision_s"])
    retrieval = iterations.filter(pc.greater(iterations["iteration"], 0))
    decisions = [d for d in iterations["decision_s"].to_pylist() if d is not None]
    engine = [e for e in retrieval["engine_s"].to_pylist() if e is not None]
    return {
        "questions": trajectories.num_rows,
        "generation_s": info["generation_seconds"],
        "after_start_s": info["generation_seconds"] - engine_start,
        "iterations": int(pc.sum(trajectories["n_iterations"]).as_py() or 0),
        "final_f1": pc.mean(trajectories["final_f1"]).as_py() or 0.0,
        "decisions": len(decisions),
        "decision_s": statistics.fmean(decisions) if decisions else None,
        "decision_median_s": statistics.median(decisions) if decisions else None,
        "iteration_engine_s": statistics.fmean(engine) if engine else None,
    }


def spread(values: list[float], fmt: str) -> str:
    """The median, with the range over repeats."""
    return f"{format(statistics.median(values), fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def saving(natural: list[dict], controller: list[dict], key: str) -> list[float]:
    """Per repeat: the share of ``key`` the controller saved (1 - controller / natural)."""
    return [1 - c[key] / n[key] for n, c in zip(natural, controller, strict=True)]


def report(natural: list[dict], controller: list[dict]) -> str:
    rows = [("natural", natural), ("controller", controller)]
    head = f"{'job':<12}{'wall s':>22}{'generation s':>22}{'after start s':>22}{'iterations':>11}{'F1':>7}"
    lines = [head, "-" * len(head)]
    for name, results in rows:
        lines.append(
            f"{name:<12}{spread([r['wall_s'] for r in results], '.1f'):>22}"
            f"{spread([r['generation_s'] for r in results], '.1f'):>22}"
            f"{spread([r['after_start_s'] for r in results], '.1f'):>22}"
            f"{statistics.median([r['iterations'] for r in results]):>11.0f}"
            f"{statistics.median([r['final_f1'] for r in results]):>7.3f}"
        )
    iterations_saved = saving(natural, controller, "iterations")
    lines.append("")
    lines.append(f"iterations saved: {spread(iterations_saved, '.1%')}")
    for key, label in (("wall_s", "command wall"), ("generation_s", "generation"), ("after_start_s", "after start")):
        saved = saving(natural, controller, key)
        ratio = [s / i if i else float("nan") for s, i in zip(saved, iterations_saved, strict=True)]
        lines.append(f"{label} saved: {spread(saved, '.1%')}; over iterations saved: {spread(ratio, '.2f')}")
    f1 = [c["final_f1"] / n["final_f1"] for n, c in zip(natural, controller, strict=True) if n["final_f1"]]
    if f1:
        lines.append(f"F1, controller over natural: {spread(f1, '.1%')}")
    timed = [c for c in controller if c["decision_s"] and c["iteration_engine_s"]]
    if timed:
        decisions = statistics.median([c["decisions"] for c in timed])
        lines.append(
            f"a decision: mean {spread([1000 * c['decision_s'] for c in timed], '.1f')} ms, "
            f"median {spread([1000 * c['decision_median_s'] for c in timed], '.1f')} ms; "
            f"an iteration's engine time: {spread([1000 * c['iteration_engine_s'] for c in timed], '.0f')} ms; "
            f"decision over iteration: {spread([c['decision_s'] / c['iteration_engine_s'] for c in timed], '.1%')} "
            f"({decisions:.0f} decisions a run)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="a predictor bundle or a run directory with models/")
    parser.add_argument("--out", type=Path, required=True, help="a folder for the runs (a rerun reuses finished ones)")
    parser.add_argument(
        "--limit", type=int, default=None, help="the dev split's first N questions of each dataset (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting for both jobs")
    args = parser.parse_args()
    if not args.bundle.exists():
        raise SystemExit(f"error: --bundle {args.bundle}: no such folder")
    if args.repeats < 1 or (args.limit is not None and args.limit < 1):
        raise SystemExit("error: --repeats and --limit take a positive number")
    model, flags, cores = cpu_description()
    print(f"CPU: {model}, {cores} cores; flags: {flags}", flush=True)
    results: dict[str, list[dict]] = {job: [] for job in JOBS}
    for repeat in range(args.repeats):
        for job in JOBS if repeat % 2 == 0 else reversed(JOBS):
            print(f"[{time.strftime('%H:%M:%S')}] repeat {repeat + 1}: {job}", flush=True)
            folder = args.out / f"r{repeat + 1}-{job}"
            results[job].append(run_job(job, folder, args.bundle, args.limit, args.set))
    print(f"\n{results['natural'][0]['questions']} dev questions, {args.repeats} repeats: median [range]\n")
    print(report(results["natural"], results["controller"]))


if __name__ == "__main__":
    main()

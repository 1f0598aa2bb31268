"""The tuned agent's levers (issue 43): each a tune-agent setting, trained on the same trajectories and measured
on the whole dev split, in one table.

    python benchmarks/agent_levers.py --data runs/agent/data --out runs/agent/levers
        [--subset 120] [--variants base,lr-4e-4,rank-32,epochs-2,top-15] [--artifact NAME=DIR ...]

``--subset N`` trains every variant on the same N trajectories of ``--data`` (a sample seeded by ``--seed``; all of
them without it), so a variant differs from ``base`` in its one setting. For each variant: ``raypipe tune-agent``
(OUT/VARIANT), ``raypipe probe`` on the dev split with its artifact (OUT/VARIANT/dev) and the figures of
``raypipe agent-eval`` (:func:`raypipe.agenttrain.dev_figures.dev_figures`), kept in OUT/VARIANT/figures.json:
a rerun skips what is done. ``--artifact NAME=DIR`` adds an existing artifact (the shipped one, a second round's)
to the table, measured the same way. Prints the CPU model and flags with the table; docs/agent-training.md holds a
result.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from raypipe.agenttrain.dev_figures import dev_figures
from raypipe.agenttrain.trajectories import TRAJECTORIES_FILE
from raypipe.core.machine import cpu_description
from raypipe.core.rundir import RunDir

# name -> tune-agent settings over the defaults (agent_train.*)
VARIANTS: dict[str, dict[str, object]] = {
    "base": {},
    "lr-4e-4": {"learning_rate": 4e-4},
    "lr-1e-4": {"learning_rate": 1e-4},
    "rank-32": {"lora_rank": 32, "lora_alpha": 64.0},
    "epochs-2": {"epochs": 2},
    "top-15": {"lora_layers": 15},
    "full": {"method": "full", "learning_rate": 2e-5},
}
FIGURES_FILE = "figures.json"


def raypipe(args: list[str], log: Path) -> float:
    """Run ``python -m raypipe ARGS`` with its output in ``log``; its wall seconds (exits on failure)."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.call([sys.executable, "-m", "raypipe", *args], stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"error: raypipe {' '.join(args)} failed ({code}); see {log}")
    return time.monotonic() - started


def subset_data(data: Path, out: Path, n: int | None, seed: int) -> Path:
    """The folder whose trajectories every variant trains on: ``data`` itself, or ``n`` of its trajectories."""
    if n is None:
        return data
    folder = out / f"data-{n}"
    target = folder / TRAJECTORIES_FILE
    if not target.exists():
        lines = [line for line in (data / TRAJECTORIES_FILE).read_text().splitlines() if line.strip()]
        if n > len(lines):
            raise SystemExit(f"error: --subset {n} is more than the {len(lines)} trajectories of {data}")
        folder.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(random.Random(seed).sample(lines, n)) + "\n")
    return folder


def evaluate(name: str, artifact: Path, folder: Path) -> dict:
    """The dev-split figures of ``artifact`` (a probe run in ``folder/dev``), with the training's own record."""
    done = folder / FIGURES_FILE
    if done.exists():
        return json.loads(done.read_text())
    probe_wall = raypipe(
        [
            "probe",
            "--set",
            f"engine.adapter={artifact}",
            "--set",
            "data.split=dev",
            "--set",
            "data.limit=null",
            "--out",
            str(folder / "dev"),
        ],
        folder / "probe.log",
    )
    manifest = json.loads((artifact / "manifest.json").read_text())
    row = {
        "name": name,
        "trajectories": len(manifest["question_ids"]),
        "steps": manifest["steps"],
        "tokens": manifest["tokens"],
        "train_wall_s": manifest["train_wall_s"],
        "hyperparameters": manifest["hyperparameters"],
        "probe_wall_s": probe_wall,
        "dev": dev_figures(RunDir(folder / "dev")),
    }
    done.write_text(json.dumps(row, indent=1))
    return row


def tune(name: str, data: Path, out: Path) -> Path:
    """The variant's artifact, trained unless it exists."""
    folder = out / name
    artifact = folder / "artifact"
    if not (artifact / "manifest.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        sets = [arg for key, value in VARIANTS[name].items() for arg in ("--set", f"agent_train.{key}={value}")]
        raypipe(["tune-agent", str(data), str(folder), *sets], folder / "tune.log")
    return artifact


def table(rows: list[dict]) -> str:
    head = (
        f"{'variant':<14}{'traj':>5}{'steps':>6}{'tokens':>9}{'train':>8}  "
        f"{'F1':>6}{'EM':>6}{'own':>6}{'P_0':>7}{'P_last':>7}{'gain':>7}{'best<end':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        d = r["dev"]
        lines.append(
            f"{r['name']:<14}{r['trajectories']:>5}{r['steps']:>6}{r['tokens']:>9}{r['train_wall_s'] / 60:>7.1f}m  "
            f"{d['final_f1']:>6.3f}{d['final_em']:>6.3f}{d['own_answer_share']:>6.0%}{d['p0']:>7.3f}"
            f"{d['p_last']:>7.3f}{d['retrieval_gain']:>+7.3f}{d['best_before_end_share']:>9.1%}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="an agent-data output folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--subset", type=int, default=None, help="train every variant on N of the trajectories")
    parser.add_argument("--seed", type=int, default=0, help="the subset's sample")
    parser.add_argument("--variants", default="base,lr-4e-4,rank-32,epochs-2", help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--artifact", action="append", default=[], metavar="NAME=DIR", help="an artifact to add")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    extra = [tuple(a.split("=", 1)) for a in args.artifact]
    if any(len(e) != 2 for e in extra):
        raise SystemExit("error: --artifact takes NAME=DIR")
    data = subset_data(args.data, args.out, args.subset, args.seed)
    rows = []
    for name in names:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: tune-agent, then the dev split", flush=True)
        rows.append(evaluate(name, tune(name, data, args.out), args.out / name))
    for name, folder in extra:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: the dev split", flush=True)
        rows.append(evaluate(name, Path(folder), args.out / name))
    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}, {cores} cores; flags: {flags}")
    print(f"dev split: {rows[0]['dev']['questions']} questions; train: wall minutes of tune-agent's steps\n")
    print(table(rows))


if __name__ == "__main__":
    main()

"""The tuned agent's levers (issue 43): each a tune-agent setting, trained on the same trajectories and measured
on the whole dev split, in one table.

    python benchmarks/agent_levers.py --data runs/agent/data --out runs/agent/levers
        [--subset 120] [--variants base,lr-4e-4,rank-32,epochs-2,top-15] [--artifact NAME=DIR ...]

``--subset N`` trains every variant on the same N trajectories of ``--data`` (a sample seeded by ``--seed``; all of
them without it), so a variant differs from ``base`` in its one setting; a variant of the agent's format
(``r1-searcher``) trains on that format's trajectories of the same questions and is measured in that format; a
variant of the data's variety (``multi-search``: trajectories that search twice or more) samples as many from the
trajectories it allows.
For each variant: ``raypipe tune-agent`` (OUT/VARIANT), ``raypipe probe`` on the dev split with its artifact
(OUT/VARIANT/dev) and the figures of ``raypipe agent-eval`` (:func:`raypipe.agenttrain.dev_figures.dev_figures`),
kept in OUT/VARIANT/figures.json: a rerun skips what is done. ``--artifact NAME=DIR`` adds an existing artifact
(the shipped one, a second round's) to the table, measured the same way. Prints the CPU model and flags with the
table; docs/agent-training.md holds a result.
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

# name -> settings over the embedded preset's (``--set`` keys): agent_train.* change the training only; any other
# (the agent's format) changes the trajectories too, which are then made again (agent-data) for the same questions
VARIANTS: dict[str, dict[str, object]] = {
    "base": {},
    "lr-4e-4": {"agent_train.learning_rate": 4e-4},
    "lr-1e-4": {"agent_train.learning_rate": 1e-4},
    "rank-32": {"agent_train.lora_rank": 32, "agent_train.lora_alpha": 64.0},
    "epochs-2": {"agent_train.epochs": 2},
    "top-15": {"agent_train.lora_layers": 15},
    "full": {"agent_train.method": "full", "agent_train.learning_rate": 2e-5},
    "r1-searcher": {"agent.protocol": "r1_searcher"},
    "multi-search": {},
}
# name -> which trajectories of --data a variant of the data's variety samples its N from (the same seed)
VARIETY = {"multi-search": lambda row: row["searches"] >= 2}
FIGURES_FILE = "figures.json"


def raypipe(args: list[str], log: Path) -> float:
    """Run ``python -m raypipe ARGS`` with its output in ``log``; its wall seconds (exits on failure)."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.call([sys.executable, "-m", "raypipe", *args], stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"error: raypipe {' '.join(args)} failed ({code}); see {log}")
    return time.monotonic() - started


def run_sets(name: str) -> list[str]:
    """The ``--set`` arguments of a variant's settings that are not the training's (the agent's format)."""
    return [f"{k}={v}" for k, v in VARIANTS[name].items() if not k.startswith("agent_train.")]


def as_args(sets: list[str]) -> list[str]:
    return [arg for item in sets for arg in ("--set", item)]


def read_lines(folder: Path) -> list[str]:
    return [line for line in (folder / TRAJECTORIES_FILE).read_text().splitlines() if line.strip()]


def subset_data(data: Path, out: Path, n: int | None, seed: int) -> Path:
    """The folder whose trajectories every variant trains on: ``data`` itself, or ``n`` of its trajectories."""
    if n is None:
        return data
    folder = out / f"data-{n}"
    target = folder / TRAJECTORIES_FILE
    if not target.exists():
        lines = read_lines(data)
        if n > len(lines):
            raise SystemExit(f"error: --subset {n} is more than the {len(lines)} trajectories of {data}")
        folder.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(random.Random(seed).sample(lines, n)) + "\n")
    return folder


def variant_data(name: str, data: Path, out: Path, source: Path, seed: int) -> Path:
    """The trajectories ``name`` trains on: ``data``; for a variant of the data's variety, as many of ``source``'s
    trajectories, sampled from those it allows; for a variant of the agent's format, that format's trajectories
    (agent-data) of ``data``'s questions (those it keeps too)."""
    if name in VARIETY:
        folder = out / name / "data"
        if not (folder / TRAJECTORIES_FILE).exists():
            allowed = [line for line in read_lines(source) if VARIETY[name](json.loads(line))]
            folder.mkdir(parents=True, exist_ok=True)
            chosen = random.Random(seed).sample(allowed, min(len(allowed), len(read_lines(data))))
            (folder / TRAJECTORIES_FILE).write_text("\n".join(chosen) + "\n")
        return folder
    sets = run_sets(name)
    if not sets:
        return data
    folder = out / name / "data"
    if not (folder / TRAJECTORIES_FILE).exists():
        built = out / name / "data-all"
        if not (built / TRAJECTORIES_FILE).exists():
            built.mkdir(parents=True, exist_ok=True)
            raypipe(["agent-data", str(built), *as_args(sets)], out / name / "agent-data.log")
        wanted = {json.loads(line)["qid"] for line in read_lines(data)}
        folder.mkdir(parents=True, exist_ok=True)
        kept = [line for line in read_lines(built) if json.loads(line)["qid"] in wanted]
        (folder / TRAJECTORIES_FILE).write_text("\n".join(kept) + "\n")
    return folder


def evaluate(name: str, artifact: Path, folder: Path, sets: list[str]) -> dict:
    """The dev-split figures of ``artifact`` (a probe run in ``folder/dev``), with the training's own record."""
    done = folder / FIGURES_FILE
    if done.exists():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
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
            *as_args(sets),
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


def tune(name: str, data: Path, out: Path, source: Path, seed: int) -> Path:
    """The variant's artifact, trained unless it exists."""
    folder = out / name
    artifact = folder / "artifact"
    if not (artifact / "manifest.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        sets = as_args([f"{k}={v}" for k, v in VARIANTS[name].items()])
        trajectories = variant_data(name, data, out, source, seed)
        raypipe(["tune-agent", str(trajectories), str(folder), *sets], folder / "tune.log")
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
        rows.append(evaluate(name, tune(name, data, args.out, args.data, args.seed), args.out / name, run_sets(name)))
    for name, folder in extra:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: the dev split", flush=True)
        rows.append(evaluate(name, Path(folder), args.out / name, []))
    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}, {cores} cores; flags: {flags}")
    print(f"dev split: {rows[0]['dev']['questions']} questions; train: wall minutes of tune-agent's steps\n")
    print(table(rows))


if __name__ == "__main__":
    main()

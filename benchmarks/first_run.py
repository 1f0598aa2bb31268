"""A first run from empty caches, timed phase by phase, with the CPU it ran on.

    python benchmarks/first_run.py                      # encoder export, index, the main job (make run's)
    python benchmarks/first_run.py --install            # install into a fresh virtual environment first
    python benchmarks/first_run.py --second             # then the same job again on the warm caches
    python benchmarks/first_run.py --set engine.enforce_eager=true   # any setting, for the index and the job

Each phase runs as its own process, as a new user's ``make run`` would, with every cache it fills in a
fresh temporary folder (``RAYPIPE_CACHE``: the exported encoder, the index, the converted model;
``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR``: vLLM's compiled graphs): ``install``
(``scripts/install.sh``, with ``--install``), ``encoder export`` (the embedded encoder's ONNX model),
``index`` (``jobs/index.py``; the table says whether the shipped vectors were used, from the index's
manifest), and the main job (``jobs/probe.py``, the embedded default's 12 questions), split into the
engine's start in its generation actor (model conversion, load, compile, warm-up; from the run's
``probe_info.yaml``) and the rest (Ray, the retrieval service, generation). Prints the CPU model, its
instruction-set flags and core count with the table; docs/engine.md holds a result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
ISA_FLAGS = re.compile(r"^(avx2|avx512\w*|avx_vnni|amx\w*|fma)$")
EXPORT = ("from raypipe.core.config import load_config; from raypipe.retrieval import encoder_spec; "
          "encoder_spec(load_config('embedded').retrieval).prepare()")


def cpu_description() -> tuple[str, str, int]:
    """(model name, instruction-set flags, logical cores) from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown", "unknown", os.cpu_count() or 0
    field = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    flags = " ".join(sorted(f for f in field.get("flags", "").split() if ISA_FLAGS.match(f)))
    return field.get("model name", "unknown"), flags, os.cpu_count() or 0


def timed(name: str, command: list[str], env: dict[str, str], log: Path) -> float:
    """Run one phase, its output to ``log``; its wall-clock seconds."""
    print(f"{name} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        code = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if code:
        sys.exit(f"{name} failed (exit {code}); its output is in {log}")
    print(f"{name}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


def vector_source(cache: Path) -> str:
    manifests = sorted((cache / "indexes").glob("*/manifest.json"))
    return json.loads(manifests[0].read_text()).get("vectors", "?") if manifests else "?"


def engine_start(run_dir: Path) -> float | None:
    """The generation actors' engine start (model, compile, warm-up), from the run's engine records."""
    info = yaml.safe_load((run_dir / "probe_info.yaml").read_text()) or {}
    starts = [e["actor_start_seconds"] for e in info.get("engines") or [] if "actor_start_seconds" in e]
    return max(starts) if starts else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--install", action="store_true", help="time scripts/install.sh into a fresh environment first")
    parser.add_argument("--second", action="store_true", help="run the main job again on the warm caches")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (caches, runs, log)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="raypipe-first-run-"))
    log = work / "first_run.log"
    env = {**os.environ, "RAYPIPE_CACHE": str(work / "cache"), "VLLM_CACHE_ROOT": str(work / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    python = sys.executable
    settings = [a for o in args.overrides for a in ("--set", o)]
    rows: list[tuple[str, float, str]] = []
    first_run_s = 0.0  # install, export, index and the first main job: what a new user waits for
    try:
        if args.install:
            venv = work / "venv"
            rows.append(("install", timed("install", ["bash", "scripts/install.sh", str(venv), "cpu"], env, log),
                         "scripts/install.sh, fresh environment (pip's own cache as it is)"))
            python = str(venv / "bin" / "python")
        rows.append(("encoder export", timed("encoder export", [python, "-c", EXPORT], env, log),
                     "the embedded encoder's ONNX model"))
        rows.append(("index", timed("index", [python, "jobs/index.py", *settings], env, log),
                     f"vectors: {vector_source(work / 'cache')}"))
        first_run_s = sum(seconds for _, seconds, _ in rows)
        for run in ("first", "second") if args.second else ("first",):
            run_dir = work / f"run-{run}"
            total = timed(f"main job ({run})", [python, "jobs/probe.py", "--out", str(run_dir), *settings], env, log)
            start = engine_start(run_dir)
            label = "main job" if run == "first" else "main job again (warm caches)"
            first_run_s += total if run == "first" else 0.0
            if start is not None:
                what = "model conversion, load, compile, warm-up" if run == "first" else "load, cached compile, warm-up"
                rows.append((f"{label}: engine start", start, what))
                rows.append((f"{label}: the rest", total - start, "Ray, retrieval service, the trajectories"))
            rows.append((f"{label}: total", total, ""))
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}; {cores} cores; flags: {flags}")
    print(f"settings: {' '.join(args.overrides) or 'the embedded default'}\n")
    print("| phase | seconds | notes |\n|---|---|---|")
    for name, seconds, notes in rows:
        print(f"| {name} | {seconds:.1f} | {notes} |")
    print(f"| **first run, in all** | **{first_run_s:.1f}** ({first_run_s / 60:.1f} min) | |")


if __name__ == "__main__":
    main()

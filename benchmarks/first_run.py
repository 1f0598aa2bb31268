"""A first run from empty caches, timed phase by phase, with the CPU it ran on.

    python benchmarks/first_run.py                      # the main job, as make run runs it
    python benchmarks/first_run.py --install            # install into a fresh virtual environment first
    python benchmarks/first_run.py --second             # then the same job again on the warm caches
    python benchmarks/first_run.py --set engine.enforce_eager=false   # any setting of the job

Each phase runs as its own process, as a new user's ``make run`` would, with every cache it fills in a
fresh temporary folder (``RAYPIPE_CACHE``: the exported encoder, the index, the converted model;
``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR``: vLLM's compiled graphs): ``install``
(``scripts/install.sh``, with ``--install``) and the main job (``jobs/probe.py``, the embedded default's
12 questions), which on a first run also exports the encoder and builds the index (the table says whether
the shipped vectors were used, from the index's manifest). The job's own records split it
(``probe_info.yaml``): its setup (Ray, encoder export, index, the retrieval service), the engine's start in
its generation actor (model load, compile, warm-up; a first run converts the model beside the setup) and
the rest (the trajectories). Prints the CPU model, its instruction-set flags and core count with the table;
docs/engine.md holds a result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from raypipe.core.machine import cpu_description

REPO = Path(__file__).resolve().parent.parent


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


def job_records(run_dir: Path) -> tuple[float | None, float | None]:
    """The job's setup seconds (Ray, index, retrieval service) and its generation actors' engine start
    (model, compile, warm-up), from the run's ``probe_info.yaml``."""
    info = yaml.safe_load((run_dir / "probe_info.yaml").read_text()) or {}
    starts = [e["actor_start_seconds"] for e in info.get("engines") or [] if "actor_start_seconds" in e]
    return info.get("setup_seconds"), (max(starts) if starts else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--install", action="store_true", help="time scripts/install.sh into a fresh environment first")
    parser.add_argument("--second", action="store_true", help="run the main job again on the warm caches")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (caches, runs, log)")
    parser.add_argument(
        "--emulate-avx2",
        action="store_true",
        help="on an AVX-512 machine, run the AVX2 code paths (benchmarks/avx2_emulation/) in float32",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="raypipe-first-run-"))
    log = work / "first_run.log"
    env = {
        **os.environ,
        "RAYPIPE_CACHE": str(work / "cache"),
        "VLLM_CACHE_ROOT": str(work / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    if args.emulate_avx2:
        env.update(
            PYTHONPATH=str(REPO / "benchmarks" / "avx2_emulation"),
            ATEN_CPU_CAPABILITY="avx2",
            ONEDNN_MAX_CPU_ISA="AVX2",
            MKL_ENABLE_INSTRUCTIONS="AVX2",
        )
        args.overrides.append("engine.dtype=float32")
    python = sys.executable
    settings = [a for o in args.overrides for a in ("--set", o)]
    rows: list[tuple[str, float, str]] = []
    first_run_s = 0.0  # install and the first main job: what a new user waits for
    try:
        if args.install:
            venv = work / "venv"
            install_env = {**env, "PIP_CACHE_DIR": str(work / "pip-cache"), "UV_CACHE_DIR": str(work / "uv-cache")}
            rows.append(
                (
                    "install",
                    timed("install", ["bash", "scripts/install.sh", str(venv), "cpu"], install_env, log),
                    "scripts/install.sh, fresh environment, empty download caches",
                )
            )
            python = str(venv / "bin" / "python")
        first_run_s = sum(seconds for _, seconds, _ in rows)
        for run in ("first", "second") if args.second else ("first",):
            run_dir = work / f"run-{run}"
            total = timed(f"main job ({run})", [python, "jobs/probe.py", "--out", str(run_dir), *settings], env, log)
            setup, start = job_records(run_dir)
            label = "main job" if run == "first" else "main job again (warm caches)"
            first_run_s += total if run == "first" else 0.0
            if setup is not None:
                what = (
                    f"Ray, encoder export, index (vectors: {vector_source(work / 'cache')}), retrieval service"
                    if run == "first"
                    else "Ray, retrieval service"
                )
                rows.append((f"{label}: setup", setup, what))
            if start is not None:
                what = (
                    "engine start in the generation actor: model conversion (begun during the setup), load, "
                    "[compile,] warm-up"
                    if run == "first"
                    else "engine start: load, [cached compile,] warm-up"
                )
                rows.append((f"{label}: engine start", start, what))
            if setup is not None and start is not None:
                rows.append(
                    (
                        f"{label}: the rest",
                        total - setup - start,
                        "the driver's start, the trajectories, Ray's shutdown",
                    )
                )
            rows.append((f"{label}: total", total, ""))
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}; {cores} cores; flags: {flags}")
    if args.emulate_avx2:
        print("emulated: the AVX2 code paths of torch, oneDNN, MKL and vLLM, float32 (benchmarks/avx2_emulation/)")
    print(f"settings: {' '.join(args.overrides) or 'the embedded default'}\n")
    print("| phase | seconds | notes |\n|---|---|---|")
    for name, seconds, notes in rows:
        print(f"| {name} | {seconds:.1f} | {notes} |")
    print(f"| **first run, in all** | **{first_run_s:.1f}** ({first_run_s / 60:.1f} min) | |")


if __name__ == "__main__":
    main()

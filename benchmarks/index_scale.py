"""Index build at scale with the hash stand-in encoder: driver memory, whole-job memory, time, resume.

Generates its own corpora (``--sizes`` passages of about 600 characters, wiki-18's mean length, over a
fixed synthetic vocabulary; cached in ``--workdir``), builds each with ``raypipe index
--set retrieval.encoder=hash:DIM`` in a subprocess and samples, every ``--every`` seconds:

- the driver's RSS (the ``raypipe index`` process),
- the whole job's memory: the PSS (shared pages split between the processes that map them, so Ray's
  object store and mapped files count once) summed over the driver and every process below it (Ray's
  GCS, raylet, workers, actors),

and prints their peaks beside the FAISS index's bytes and the wall time. Then the resume case, at the
smallest size: a build whose driver process group is killed with SIGKILL once about half of the blocks
are written, then run again; the second run's ``passages_encoded`` (from the manifest) and whether its
``index.faiss`` equals the uninterrupted build's.

    python benchmarks/index_scale.py                                  # 0.5M, 1M, 2M at 768 dimensions
    python benchmarks/index_scale.py --sizes 20000,50000 --dim 64     # a quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

PASSAGE_CHARS = 600
VOCABULARY = 50_000


def make_corpus(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` jsonl passages ``{"id", "contents": "\\"Title\\"\\ntext"}`` of about 600 characters."""
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(3, 10, VOCABULARY)
    words = ["".join(rng.choice(letters, k)) for k in lengths]
    per_passage = PASSAGE_CHARS // int(lengths.mean() + 1)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as fh:
        for start in range(0, n, 10_000):
            ids = rng.zipf(1.3, size=(min(10_000, n - start), per_passage + 2)) % VOCABULARY
            for i, row in enumerate(ids):
                title = " ".join(words[j] for j in row[:2]).title()
                text = " ".join(words[j] for j in row[2:])
                fh.write(json.dumps({"id": str(start + i), "contents": f'"{title}"\n{text}'}) + "\n")
    tmp.rename(path)
    return path


class Sampler(threading.Thread):
    """Peak driver RSS and peak summed PSS of the process tree under ``pid``."""

    def __init__(self, pid: int, every: float):
        super().__init__(daemon=True)
        self.root, self.every = psutil.Process(pid), every
        self.driver_peak = self.job_peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.driver_peak = max(self.driver_peak, self.root.memory_info().rss)
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for proc in procs:
                try:
                    total += proc.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.job_peak = max(self.job_peak, total)
            self.stop.wait(self.every)


def index_command(corpus: Path, index_dir: Path, dim: int, block_rows: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "raypipe",
        "index",
        "--set",
        f"data.corpus={corpus}",
        "--set",
        f"retrieval.encoder=hash:{dim}",
        "--set",
        f"retrieval.index.dir={index_dir}",
        "--set",
        f"retrieval.encode.block_rows={block_rows}",
    ]


def run_build(cmd: list[str], every: float, log: Path, kill_when=None) -> dict:
    """Run one build; ``kill_when()`` true: SIGKILL its whole process group (the driver and Ray)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        sampler = Sampler(proc.pid, every)
        sampler.start()
        killed = False
        while proc.poll() is None:
            if kill_when is not None and not killed and kill_when():
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            time.sleep(0.2)
        sampler.stop.set()
        sampler.join()
    if proc.returncode != 0 and not killed:
        raise SystemExit(f"build failed (exit {proc.returncode}); see {log}")
    return {
        "seconds": time.perf_counter() - start,
        "driver_peak": sampler.driver_peak,
        "job_peak": sampler.job_peak,
        "killed": killed,
    }


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="500000,1000000,2000000", help="passages per corpus, comma-separated")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--block-rows", type=int, default=10_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/raypipe-index-scale"))
    parser.add_argument("--every", type=float, default=0.5, help="memory sampling interval, seconds")
    parser.add_argument("--no-resume", action="store_true", help="skip the kill-at-half resume case")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows, keep = [], {}
    for n in sizes:
        corpus = make_corpus(args.workdir / f"corpus-{n}.jsonl", n)
        index_dir = args.workdir / f"index-{n}"
        if index_dir.exists():
            subprocess.run(["rm", "-rf", str(index_dir)], check=True)
        result = run_build(
            index_command(corpus, index_dir, args.dim, args.block_rows), args.every, args.workdir / f"build-{n}.log"
        )
        index_bytes = (index_dir / "index.faiss").stat().st_size
        rows.append({"passages": n, **result, "index_bytes": index_bytes})
        print(
            f"{n:>10,} passages: {result['seconds']:.0f} s, driver peak {result['driver_peak'] / 2**20:.0f} MiB, "
            f"job peak {result['job_peak'] / 2**30:.2f} GiB, index {index_bytes / 2**30:.2f} GiB",
            flush=True,
        )
        if n == min(sizes):
            keep = {"corpus": corpus, "sha": sha256(index_dir / "index.faiss")}
        else:
            subprocess.run(["rm", "-rf", str(index_dir)], check=True)

    print("\n| passages | build time | driver peak RSS | whole-job peak (PSS) | index bytes | job peak - index |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['passages']:,} | {r['seconds']:.0f} s | {r['driver_peak'] / 2**20:.0f} MiB | "
            f"{r['job_peak'] / 2**30:.2f} GiB | {r['index_bytes'] / 2**30:.2f} GiB | "
            f"{(r['job_peak'] - r['index_bytes']) / 2**30:.2f} GiB |"
        )
    drivers = [r["driver_peak"] for r in rows]
    print(
        f"\ndriver peak spread {(max(drivers) - min(drivers)) / 2**20:.0f} MiB (target <= 300 MiB), "
        f"max {max(drivers) / 2**20:.0f} MiB (target < 1.5 GiB); job peak - index at most "
        f"{max((r['job_peak'] - r['index_bytes']) for r in rows) / 2**30:.2f} GiB (target <= 3 GiB)"
    )

    if args.no_resume:
        return
    n = min(sizes)
    index_dir = args.workdir / f"resume-{n}"
    subprocess.run(["rm", "-rf", str(index_dir), str(index_dir.with_name(f".{index_dir.name}.build"))], check=True)
    blocks_dir = index_dir.with_name(f".{index_dir.name}.build") / "blocks"
    total_blocks = -(-n // args.block_rows)
    cmd = index_command(keep["corpus"], index_dir, args.dim, args.block_rows)
    first = run_build(
        cmd,
        args.every,
        args.workdir / f"resume-{n}-killed.log",
        kill_when=lambda: blocks_dir.exists() and len(list(blocks_dir.glob("*.npy"))) >= total_blocks / 2,
    )
    written = len(list(blocks_dir.glob("*.npy")))
    second = run_build(cmd, args.every, args.workdir / f"resume-{n}.log")
    manifest = json.loads((index_dir / "manifest.json").read_text())
    encoded = manifest["build"]["passages_encoded"]
    equal = sha256(index_dir / "index.faiss") == keep["sha"]
    print(
        f"\nresume at {n:,} passages: killed after {first['seconds']:.0f} s with {written} of {total_blocks} blocks "
        f"written; the rerun encoded {encoded:,} passages ({encoded / n:.0%}, target <= 60%) in "
        f"{second['seconds']:.0f} s; index.faiss equal to the uninterrupted build's: {equal}"
    )


if __name__ == "__main__":
    main()

"""How far the embedded encoder's vectors move from one instruction set to another.

    python benchmarks/encoder_spread.py [--passages 48] [--queries 48] [--qemu-cpu EPYC-Rome] [--qemu-texts 12]

Encodes the same random bundled passages and questions with MiniLM (ONNX fp32 and torch fp32, one
passage per ONNX call as raypipe does, and ONNX int8 passages) with one thread in three settings:

- ``native``: this CPU as it is;
- ``capped``: torch, MKL and oneDNN held to AVX2 (``ATEN_CPU_CAPABILITY=avx2``,
  ``MKL_ENABLE_INSTRUCTIONS=AVX2``, ``ONEDNN_MAX_CPU_ISA=AVX2``; ONNX Runtime has no such switch);
- ``qemu``: the same script under ``qemu-x86_64 -cpu EPYC-Rome`` (qemu-user, an AVX2-only AMD EPYC
  emulated instruction by instruction: every library's CPU detection sees no AVX-512 and runs its AVX2
  kernels, ONNX Runtime's included), when qemu-user is installed (``apt-get install qemu-user``). The
  emulation runs about 60 times slower, so it encodes the first ``--qemu-texts`` passages and
  questions only, with the ONNX encoders (torch crashes under qemu-user 7.2).

and prints, per encoder and setting, the largest L2 distance and 1 - the least cosine (both in float64) of
each vector to the native ONNX fp32 vector of the same text, and to the same encoder's native vector.
docs/retrieval.md ("Shipped vectors") holds the result; ``raypipe.retrieval.shipped.ISA_SPREAD`` is set
from it.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from raypipe.data.loaders import BUNDLED_CORPUS, BUNDLED_DATASETS, iter_corpus, load_questions
from raypipe.retrieval.encoders import EncoderSpec, passage_text

ENCODERS = {  # name -> (spec, what it encodes)
    "onnx fp32 passages": (EncoderSpec(backend="onnx", quantization="none", threads=1), "passages"),
    "onnx fp32 queries": (EncoderSpec(backend="onnx", quantization="none", threads=1), "queries"),
    "torch fp32 passages": (EncoderSpec(backend="torch", quantization="none", threads=1, device="cpu"), "passages"),
    "torch fp32 queries": (EncoderSpec(backend="torch", quantization="none", threads=1, device="cpu"), "queries"),
    "onnx int8 passages": (EncoderSpec(backend="onnx", quantization="int8", threads=1), "passages"),
}
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def sample_texts(passages: int, queries: int) -> dict[str, list[str]]:
    """The first texts of a fixed shuffle of the bundled passages and questions (a smaller sample is a prefix)."""
    corpus = list(iter_corpus(BUNDLED_CORPUS))
    questions = [q.question for name in BUNDLED_DATASETS for q in load_questions(name)]
    random.Random(0).shuffle(corpus)
    random.Random(0).shuffle(questions)
    return {"passages": [passage_text(p.title, p.text) for p in corpus[:passages]], "queries": questions[:queries]}


def cpu_features() -> str:
    """The SIMD sets the CPU reports to programs (cpuid, as the kernels' dispatch sees it)."""
    from numpy._core._multiarray_umath import __cpu_features__  # numpy's runtime detection

    names = ("AVX2", "FMA3", "AVX512F", "AVX512BW", "AVX512VNNI")
    return " ".join(n for n in names if __cpu_features__.get(n))


def encode(out: Path, passages: int, queries: int, names: list[str]) -> None:
    """Write the named encoders' vectors of the sample to ``out`` (.npz, rewritten after each encoder),
    with the CPU features seen."""
    texts = sample_texts(passages, queries)
    arrays = {"features": np.array(cpu_features())}
    for name in names:
        spec, kind = ENCODERS[name]
        encoder = spec.load()
        start = time.perf_counter()
        arrays[name] = (encoder.encode_passages if kind == "passages" else encoder.encode_queries)(texts[kind])
        print(f"  {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        np.savez(out, **arrays)


def compare(reference: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    a, b = reference.astype(np.float64), other.astype(np.float64)
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(np.linalg.norm(a - b, axis=1).max()), float(cosine.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=48)
    parser.add_argument("--queries", type=int, default=48)
    parser.add_argument("--qemu-cpu", default="EPYC-Rome", help="the emulated CPU model ('' skips the qemu run)")
    parser.add_argument("--qemu-texts", type=int, default=12, help="passages and questions encoded under qemu")
    parser.add_argument("--encode", type=Path, help=argparse.SUPPRESS)  # a child: encode into this file
    parser.add_argument("--encoders", default=",".join(ENCODERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.encode:
        encode(args.encode, args.passages, args.queries, args.encoders.split(","))
        return
    cache = Path(tempfile.mkdtemp(prefix="raypipe-spread-"))
    env = {**os.environ, "RAYPIPE_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    sizes = ["--passages", str(args.passages), "--queries", str(args.queries)]
    settings = {"native": ([], {}, sizes, list(ENCODERS)), "capped": ([], AVX2_CAPS, sizes, list(ENCODERS))}
    qemu = shutil.which("qemu-x86_64")
    if args.qemu_cpu and qemu:
        small = ["--passages", str(args.qemu_texts), "--queries", str(args.qemu_texts)]
        settings["qemu"] = ([qemu, "-cpu", args.qemu_cpu], {}, small, [n for n in ENCODERS if n.startswith("onnx")])
    results = {}
    try:
        for setting, (prefix, extra, size, names) in settings.items():  # native first: it exports the ONNX models
            out = cache / f"{setting}.npz"
            start = time.perf_counter()
            print(f"{setting} ...", file=sys.stderr, flush=True)
            child = [sys.executable, __file__, *size, "--encoders", ",".join(names), "--encode", str(out)]
            code = subprocess.run([*prefix, *child], env={**env, **extra}).returncode
            print(f"{setting}: {time.perf_counter() - start:.0f} s, exit {code}", file=sys.stderr, flush=True)
            if out.exists():
                results[setting] = dict(np.load(out))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    native = results["native"]
    print(
        f"\nrandom bundled passages and questions ({args.passages} and {args.queries}; {args.qemu_texts} each under "
        "qemu); distances to native ONNX fp32 of the same texts (float64)\n"
    )
    print(
        "| setting (CPU features seen) | encoder | texts | to native ONNX fp32: largest L2 distance, 1 - least "
        "cosine | to the same encoder native: largest L2 distance, 1 - least cosine |\n|---|---|---|---|---|"
    )
    for setting, arrays in results.items():
        for name, (_, kind) in ENCODERS.items():
            if name in arrays:
                vectors = arrays[name]
                cells = [
                    compare(native[reference][: len(vectors)], vectors) for reference in (f"onnx fp32 {kind}", name)
                ]
                print(
                    f"| {setting} ({arrays['features']}) | {name} | {len(vectors)} | "
                    + " | ".join(f"{d:.2e}, {1 - c:.1e}" for d, c in cells)
                    + " |"
                )


if __name__ == "__main__":
    main()

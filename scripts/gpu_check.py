#!/usr/bin/env python
"""raypipe's own GPU code on one GPU, in a few minutes, without Ray, vLLM or FAISS (docs/gpu-check.md).

Checks, each a row of the table printed at the end (exit status 1 when one fails):

- encoder: raypipe's torch encoder (``SentenceTransformerEncoder``, float16 on cuda) gives each text the
  vector the CPU's float32 encoder gives, to cosine >= 0.999;
- cross-encoder / Q-network: one epoch of ``CrossEncoderTraining`` and of ``QNetTraining`` (the Ray-free
  loops Ray Train runs) on a ``LocalWorker`` on the device, with a finite loss;
- clone replay: the GPU allocations of a flat index's clone (:mod:`raypipe.retrieval.gpu_memory`: faiss 1.15's
  cloner, all rows at once, and the paged add raypipe uses) replayed with torch allocations under memory caps
  (45 and 80 GiB): each must fit exactly when its computed peak does;
- search: exact inner-product top-k of a query batch over a float16 matrix of wiki-18's size (matmul and
  top-k in blocks of rows, as FAISS's flat GPU search), its speed, and its results equal to one block's.

Models are BERTs with random weights built from a config (``--model-size``; no checkpoint is needed: the
checks compare devices and run training steps, they measure no quality). ``--device cpu --rows 20000`` runs
every check small on a CPU (the test suite does).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raypipe.retrieval.gpu_memory import WIKI18_ROWS, Event, GiB, clone_events, peak_bytes  # noqa: E402

COSINE_MIN = 0.999  # float16 on the GPU against float32 on the CPU, per text
WORDS = (
    "the of and in to was is for on as by with he at from his an were are which this also be first has had "
    "after one their its new who they two her she been other when there all during into school time may years "
    "more most only over city some world would where later up such used many can state about national out known "
    "university united then made county team film born american river war album music game season series north "
    "south east west members president church history people village station population family company year"
).split()
SIZES = {  # BERT shapes: base = e5-base-v2's (the preset's encoder), tiny for the CPU run
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
}


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


def texts(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of 8 to 60 words (a fixed pseudo-random sequence)."""
    out, state = [], seed
    for _ in range(n):
        state = (state * 1103515245 + 12345) % 2**31
        length = 8 + state % 53
        out.append(" ".join(WORDS[(state >> 3) * (j + 7) % len(WORDS)] for j in range(length)))
    return out


def random_bert(folder: Path, size: str) -> Path:
    """A BERT encoder with random (seeded) weights and a WordPiece tokenizer over :data:`WORDS`."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), model_max_length=512)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **SIZES[size])
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def timed(name: str, run: Callable[[], tuple[bool, str]]) -> Result:
    """Run one check; an exception is its failure, with the exception's line as the detail."""
    start = time.perf_counter()
    try:
        ok, detail = run()
    except Exception as exc:  # noqa: BLE001 (a check's failure is reported, the next check still runs)
        ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return Result(name, ok, detail, time.perf_counter() - start)


def check_encoder(device: str, model: Path) -> tuple[bool, str]:
    import numpy as np

    from raypipe.retrieval.encoders import EncoderSpec, SentenceTransformerEncoder

    spec = EncoderSpec(ref=str(model), prefixes="none", max_length=256, batch_size=32, backend="torch")
    sample = texts(256)
    here = SentenceTransformerEncoder(replace(spec, device=device)).encode_passages(sample)
    cpu = SentenceTransformerEncoder(replace(spec, device="cpu")).encode_passages(sample)
    norms = np.linalg.norm(here, axis=1)
    cosine = float(np.min(np.sum(here * cpu, axis=1) / norms / np.linalg.norm(cpu, axis=1)))
    ok = cosine >= COSINE_MIN and bool(np.all(np.abs(norms - 1) < 1e-3))
    precision = "float16" if device.startswith("cuda") else "float32"
    return ok, (
        f"{len(sample)} texts, {precision} on {device} vs float32 on cpu: min cosine {cosine:.5f} (>= {COSINE_MIN})"
    )


def check_crossencoder(device: str, model: Path) -> tuple[bool, str]:
    from raypipe.core.training import LocalWorker
    from raypipe.predict.crossencoder import Task
    from raypipe.predict.crossencoder_train import CrossEncoderTraining

    sample = texts(32, seed=1)
    task = Task("gpu-check", "adjacent_think", sample, [float(i % 2) for i in range(len(sample))])
    config = {
        "base": str(model),
        "tasks": [task],
        "max_tokens": 128,
        "batch_size": 8,
        "accum": 2,
        "lr": 2e-5,
        "weight_decay": 0.01,
        "dropout": 0.1,
        "epochs": 1,
        "seed": 0,
        "threads": 0,
    }
    end = next(CrossEncoderTraining(config, LocalWorker(device=device)).epochs())
    loss = end.metrics["train_loss"]
    return math.isfinite(loss), f"1 epoch, {len(sample)} pairs, 2 optimizer steps on {device}: loss {loss:.4f}"


def check_qnetwork(device: str, model: Path) -> tuple[bool, str]:
    import torch

    from raypipe.core.config import StopRagConfig
    from raypipe.core.training import LocalWorker
    from raypipe.stoprag.targets import Sample
    from raypipe.stoprag.train import QNetTraining, loop_config

    states = texts(16, seed=2)
    samples = [
        Sample(state=i, reward=(i % 3) / 2, future_rewards=((i + 1) % 3 / 2, (i + 2) % 3 / 2), future_states=(i + 1,))
        for i in range(len(states) - 1)
    ]
    cfg = StopRagConfig(max_length=128, batch_size=4, epochs=1, use_gpu=device != "cpu")
    config = loop_config(states, samples, cfg, model, seed=0, meta={})
    end = next(QNetTraining(config, LocalWorker(device=torch.device(device))).epochs())
    loss = end.metrics["loss"]
    steps = end.metrics["step"]
    return math.isfinite(loss), f"1 epoch, {len(samples)} states, {steps} steps on {device}: loss {loss:.4f}"


def replay(events: list[Event], device: str, cap: int) -> str | None:
    """Allocate the events' bytes with torch in order; None when all fit, else the event that did not. On cuda
    torch's allocator enforces the cap (set by the caller); on a CPU the replay counts against it itself."""
    import torch

    held: dict[str, object] = {}
    total = 0
    try:
        for event in events:
            if not event.bytes:
                total -= held.pop(event.name).numel()
                continue
            if device == "cpu" and total + event.bytes > cap:
                return event.name
            held[event.name] = torch.empty(event.bytes, dtype=torch.uint8, device=device)
            total += event.bytes
    except torch.cuda.OutOfMemoryError:
        return event.name
    finally:
        held.clear()
        if device != "cpu":
            torch.cuda.empty_cache()
    return None


def check_clone_replay(device: str, rows: int, dim: int, caps_gib: list[float]) -> list[Result]:
    """Each clone way under each cap: replayed, and compared with whether its computed peak fits."""
    import torch

    card = None
    if device != "cpu":
        gc.collect()  # the models of the checks before: freed, and their cached blocks given back
        torch.cuda.empty_cache()
        card = torch.cuda.get_device_properties(device).total_memory
    results = []
    for cap_gib in caps_gib:
        cap = int(cap_gib * GiB)
        if card is not None:
            fraction = min(1.0, cap / card)
            torch.cuda.set_per_process_memory_fraction(fraction, device)
            cap = int(fraction * card)
        for label, fp16, method in (
            ("faiss cloner, float16", True, "copy"),
            ("paged add, float16", True, "paged"),
            ("paged add, float32", False, "paged"),
        ):
            events = clone_events(rows, dim, fp16, method)
            peak = peak_bytes(events)

            def run(events=events, peak=peak, cap=cap) -> tuple[bool, str]:
                failed = replay(events, device, cap)
                expected = "fits" if peak <= cap else "does not fit"
                got = "fits" if failed is None else f"out of memory at {failed!r}"
                detail = f"peak {peak / GiB:.2f} GiB {expected} in {cap / GiB:.2f} GiB: {got}"
                return (failed is None) == (peak <= cap), detail

            results.append(timed(f"clone replay {cap_gib:g} GiB: {label}", run))
    if card is not None:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return results


def check_search(device: str, rows: int, dim: int, queries: int = 256, k: int = 100) -> tuple[bool, str]:
    """Exact top-k over a random normalised matrix (float16 on cuda, float32 on a CPU) in blocks of up to 2M rows
    (at least four blocks), checked against the same search in blocks a third as long."""
    import torch

    block_rows = max(k, min(1 << 21, rows // 4))
    dtype = torch.float16 if device != "cpu" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    matrix = torch.empty((rows, dim), dtype=dtype, device=device)
    for start in range(0, rows, 1 << 20):
        chunk = torch.randn((min(1 << 20, rows - start), dim), generator=generator, device=device)
        matrix[start : start + len(chunk)] = torch.nn.functional.normalize(chunk, dim=1).to(dtype)
    q = torch.nn.functional.normalize(torch.randn((queries, dim), generator=generator, device=device), dim=1).to(dtype)

    def search(block: int) -> tuple[torch.Tensor, torch.Tensor]:
        best_scores = best_ids = None
        for start in range(0, rows, block):
            scores, ids = (q @ matrix[start : start + block].T).topk(min(k, block, rows - start), dim=1)
            scores, ids = scores.float(), ids + start
            if best_scores is not None:
                scores, pos = torch.cat([best_scores, scores], 1).topk(k, dim=1)
                ids = torch.cat([best_ids, ids], 1).gather(1, pos)
            best_scores, best_ids = scores, ids
        return best_scores, best_ids

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize(device)

    search(block_rows)
    sync()
    start, repeats = time.perf_counter(), 3
    for _ in range(repeats):
        scores, _ = search(block_rows)
    sync()
    seconds = (time.perf_counter() - start) / repeats
    other_scores, _ = search(max(1, block_rows // 3))  # other block boundaries, the same exact result
    same = torch.allclose(scores, other_scores, atol=1e-3)
    matrix = None  # frees it before empty_cache (not del: search, a closure, reads the name)
    if device != "cpu":
        torch.cuda.empty_cache()
    return same, (
        f"{queries} queries x {rows:,} x {dim} ({str(dtype).removeprefix('torch.')}), top-{k}: "
        f"{seconds * 1000:.1f} ms per batch, {queries / seconds:,.0f} queries/s; other blocks agree: {same}"
    )


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the models are built here
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the random models' load reports (a new classifier head) are expected

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=None, help="Index rows (default: wiki-18's on cuda, 20000 on cpu).")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--caps", default="45,80", help="GiB caps of the clone replay, comma-separated.")
    parser.add_argument("--model-size", choices=sorted(SIZES), default=None, help="Default: base on cuda, tiny on cpu.")
    args = parser.parse_args(argv)
    on_gpu = args.device != "cpu"
    rows = args.rows or (WIKI18_ROWS if on_gpu else 20_000)
    size = args.model_size or ("base" if on_gpu else "tiny")
    caps = [float(c) for c in args.caps.split(",")]
    where = torch.cuda.get_device_name(args.device) if on_gpu else "cpu"
    print(
        f"gpu_check on {where}: torch {torch.__version__}, rows {rows:,} x {args.dim}, {size} BERT (random weights)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="raypipe-gpu-check-") as tmp:
        model = random_bert(Path(tmp) / "bert", size)
        results = [
            timed("encoder", lambda: check_encoder(args.device, model)),
            timed("cross-encoder step", lambda: check_crossencoder(args.device, model)),
            timed("Q-network step", lambda: check_qnetwork(args.device, model)),
        ]
    results += check_clone_replay(args.device, rows, args.dim, caps)
    results.append(timed("search", lambda: check_search(args.device, rows, args.dim)))
    loaded = [name for name in ("ray", "faiss", "vllm") if sys.modules.get(name) is not None]
    detail = f"imported: {', '.join(loaded)}" if loaded else "no ray, faiss or vllm imported"
    results.append(Result("stack", not loaded, detail))
    width = max(len(r.name) for r in results)
    print(f"{'check':<{width}}  result  seconds  detail")
    for r in results:
        print(f"{r.name:<{width}}  {'ok' if r.ok else 'FAIL':<6}  {r.seconds:7.1f}  {r.detail}")
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

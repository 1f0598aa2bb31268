"""Per-step cost model of the generation engine on this CPU: decode step time against batch size and context
length, prefill time against prompt tokens, and how far both are from the hardware's limits.

    python benchmarks/engine_cost.py                      # the embedded preset's engine, about 5 min on 2 cores
    python benchmarks/engine_cost.py --quick              # a 1-minute smoke
    python benchmarks/engine_cost.py --set engine.enforce_eager=false --set engine.speculative_ngram_tokens=3

The engine is raypipe's own (``build_engine``) with the config's engine settings (``--config``/``--set``; the
context is raised to fit the longest prompt when it is shorter). Prompts are raw bundled corpus text (no chat
template), token-exact through the engine's tokenizer, a distinct window of text per request so requests share
no prefix; greedy.

- Decode: B concurrent requests of ``context`` prompt tokens. An untimed run puts the prompts in the prefix
  cache; then the same requests are asked for N1 and for N2 new tokens (``repeats`` times each, the fastest
  counts) and the step time is (wall(N2) - wall(N1)) / (N2 - N1): every timed run prefills only each prompt's
  last, partial KV block, so the prefill cancels out exactly and its noise stays out (the table's "prompt
  cached" column shows the cache held). The cache is emptied at each new context; the cells of one context
  share their prompts (a larger batch adds new ones). Requests must generate exactly what they ask for: one
  that ends at end-of-sequence earlier gets the next window of text and the cell runs again. Cells with more
  than ``--max-cell-tokens`` prompt tokens are skipped (their prefill would dominate the run).
- Prefill: ``max_tokens=1`` requests on an empty prefix cache, one alone and a batch sharing the same total.
- Limits: a decode step reads every weight once and each request's KV cache (memory bound: bytes / the
  bandwidth of a numpy copy on every core) and computes 2 x parameters + 4 x layers x context x hidden FLOPs
  per token (compute bound: / the FLOP/s of one torch matmul of the model's hidden sizes at the engine's
  dtype); the bound is the larger of the two. Both are measured after the engine is closed.

Prints the CPU, the engine, then markdown tables of decode step times (with tokens/s = B / step time and the
share of the bound reached) and of prefill rates, then the hardware-limit line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.machine import cpu_description
from raypipe.data.loaders import load_corpus
from raypipe.llm.base import Engine, Generation, GenerationRequest
from raypipe.llm.factory import build_engine

log = logging.getLogger(__name__)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
TEXT_TRIES = 3  # batches run again with fresh text when a request stops at end-of-sequence
CHARS_PER_TOKEN_MAX = 8  # a window of this many characters per token holds the prompt's tokens


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    new_tokens: tuple[int, int]  # N1, N2
    repeats: int  # timed runs of each length per decode cell; the fastest counts
    prefill_tokens: tuple[int, ...]  # total prompt tokens per prefill measurement
    prefill_batch: int  # the batched prefill splits the total over this many requests

    @staticmethod
    def default(quick: bool) -> Grid:
        if quick:
            return Grid((1, 4), (256,), (4, 20), 1, (256, 1024), 4)
        return Grid((1, 2, 4, 8, 16, 32), (256, 1024, 2048), (8, 40), 2, (256, 512, 1024, 2048, 4096), 8)

    def longest_request(self) -> int:
        return max(max(self.contexts) + self.new_tokens[1], max(self.prefill_tokens) + 1)


@dataclass(frozen=True)
class ModelShape:
    """What the limits need from the model folder: parameters and the sizes of one layer."""

    parameters: int
    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # key/value heads x head size

    @staticmethod
    def read(folder: Path) -> ModelShape:
        config = json.loads((folder / "config.json").read_text())
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        return ModelShape(
            parameters=sum(safetensors_parameters(f) for f in folder.glob("*.safetensors")),
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            kv_width=kv_heads * head_dim,
        )

    def flops_per_token(self, context: int) -> float:
        """Weights' multiply-adds plus attention over ``context`` cached tokens (scores and values)."""
        return 2 * self.parameters + 4 * self.layers * context * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_width * dtype_bytes


def safetensors_parameters(path: Path) -> int:
    """Parameters in one safetensors file, from its header (the tensors are not loaded)."""
    with path.open("rb") as fh:
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


class TextWindows:
    """Token-exact prompts cut from consecutive windows of the bundled corpus, never the same window twice."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.text = "\n\n".join(f"{p.title}\n{p.text}" for p in load_corpus())
        self.cursor = 0
        self.prompts: dict[int, list[str]] = {}  # by length: the windows handed out, replaced ones swapped

    def take(self, tokens: int, count: int) -> list[str]:
        prompts = self.prompts.setdefault(tokens, [])
        while len(prompts) < count:
            prompts.append(self._next(tokens))
        return prompts[:count]

    def replace(self, tokens: int, indices: list[int]) -> None:
        for i in indices:
            self.prompts[tokens][i] = self._next(tokens)

    def _next(self, tokens: int) -> str:
        """The next window of exactly ``tokens`` tokens: the longest prefix that does not exceed them."""
        while self.cursor < len(self.text):
            window = self.text[self.cursor : self.cursor + tokens * CHARS_PER_TOKEN_MAX]
            low, high = 0, len(window)  # count_tokens(window[:low]) <= tokens
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if self.engine.count_tokens(window[:middle]) <= tokens else (low, middle - 1)
            self.cursor += max(low, 1)
            if self.engine.count_tokens(window[:low]) == tokens:
                return window[:low]
        raise RuntimeError(f"the bundled corpus has no more windows of {tokens} tokens")


async def timed_batch(engine: Engine, prompts: list[str], max_tokens: int) -> tuple[float, list[Generation]]:
    """Wall seconds for ``prompts`` submitted together, and their generations."""
    started = time.perf_counter()
    generations = await asyncio.gather(
        *(engine.generate(GenerationRequest(prompt=p, max_tokens=max_tokens)) for p in prompts)
    )
    return time.perf_counter() - started, generations


async def empty_prefix_cache(engine: Engine) -> None:
    if not await engine.reset_prefix_cache():
        log.warning("the engine did not empty its prefix cache")


@dataclass(frozen=True)
class DecodeCell:
    batch: int
    context: int
    step_s: float | None = None  # None: skipped
    cached: float | None = None  # the smallest share of prompt tokens the timed runs found in the prefix cache


async def decode_cell(engine: Engine, windows: TextWindows, grid: Grid, batch: int, context: int) -> DecodeCell:
    """Seconds per decode step of ``batch`` requests at ``context`` prompt tokens. An untimed run of N1 tokens
    fills the prefix cache with the prompts (and meets the batch's shapes first), so the timed runs prefill
    only each prompt's last, partial block, the same in all of them: the prefill cancels out."""
    n1, n2 = grid.new_tokens
    for _ in range(TEXT_TRIES):
        prompts = windows.take(context, batch)
        await timed_batch(engine, prompts, n1)
        walls: dict[int, list[float]] = {n1: [], n2: []}
        generations: list[Generation] = []
        for _ in range(grid.repeats):
            for tokens in (n1, n2):
                wall, outputs = await timed_batch(engine, prompts, tokens)
                walls[tokens].append(wall)
                generations += outputs
        short = sorted({i % batch for i, g in enumerate(generations) if g.finish_reason != "length"})
        if not short:
            cached = min((g.cached_prompt_tokens or 0) / g.prompt_tokens for g in generations)
            return DecodeCell(batch, context, (min(walls[n2]) - min(walls[n1])) / (n2 - n1), cached)
        log.info("batch %d, context %d: %d requests ended early; new text for them", batch, context, len(short))
        windows.replace(context, short)
    raise RuntimeError(f"requests kept ending before {n2} tokens at batch {batch}, context {context}")


async def measure(engine: Engine, grid: Grid, max_cell_tokens: int) -> tuple[list[DecodeCell], list[tuple]]:
    """Decode cells and prefill rows (requests, tokens per request, seconds)."""
    windows = TextWindows(engine)
    await engine.warmup()
    decode = []
    for context in grid.contexts:
        await empty_prefix_cache(engine)  # the cells of one context share prompts: a larger batch adds new ones
        for batch in grid.batches:
            if batch * context > max_cell_tokens:
                decode.append(DecodeCell(batch, context))
                continue
            decode.append(await decode_cell(engine, windows, grid, batch, context))
            log.info("decode: batch %d, context %d: %.1f ms per step", batch, context, decode[-1].step_s * 1e3)
    prefill = []
    for total in grid.prefill_tokens:
        for requests in sorted({1, grid.prefill_batch}):
            await empty_prefix_cache(engine)
            seconds, _ = await timed_batch(engine, windows.take(total // requests, requests), 1)
            log.info("prefill: %d x %d tokens: %.2f s", requests, total // requests, seconds)
            prefill.append((requests, total // requests, seconds))
    return decode, prefill


def stream_bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second of a numpy copy (read + write) of a large array split over ``threads`` threads (numpy
    copies without the GIL), the best of ``repeats``."""
    source = np.ones(megabytes << 18, dtype=np.float32)
    target = np.empty_like(source)
    parts = list(zip(np.array_split(target, threads), np.array_split(source, threads)))
    best = math.inf
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            started = time.perf_counter()
            list(pool.map(lambda part: np.copyto(*part), parts))
            best = min(best, time.perf_counter() - started)
    return 2 * source.nbytes / best


def matmul_flops(shape: ModelShape, dtype: str, tokens: int = 512, repeats: int = 5) -> float:
    """FLOP/s of torch's matmul at ``dtype``: ``tokens`` x hidden @ hidden x intermediate, the best of ``repeats``."""
    import torch

    left = torch.randn(tokens, shape.hidden, dtype=getattr(torch, dtype))
    right = torch.randn(shape.hidden, shape.intermediate, dtype=getattr(torch, dtype))
    torch.matmul(left, right)  # first-use costs
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        torch.matmul(left, right)
        best = min(best, time.perf_counter() - started)
    return 2 * tokens * shape.hidden * shape.intermediate / best


def print_report(
    record: dict, shape: ModelShape, settings: str, decode: list[DecodeCell], prefill: list[tuple], grid: Grid
) -> None:
    import torch

    dtype = record["dtype"]
    dtype_bytes = DTYPE_BYTES[dtype]
    threads = len(os.sched_getaffinity(0))
    bandwidth, flops = stream_bandwidth(threads), matmul_flops(shape, dtype)
    weight_bytes = shape.parameters * dtype_bytes

    def bound(batch: int, context: int) -> float:
        memory = (weight_bytes + batch * context * shape.kv_bytes_per_token(dtype_bytes)) / bandwidth
        return max(memory, batch * shape.flops_per_token(context) / flops)

    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}; {cores} cores; flags: {flags}")
    print(
        f"engine: {record['backend']} {Path(record['model_path']).name} ({shape.parameters / 1e6:.1f}M parameters), "
        f"{dtype}, block {record.get('block_size', '-')}, eager {record.get('enforce_eager', '-')}, "
        f"context {record['max_model_len']}; settings: {settings}"
    )
    n1, n2 = grid.new_tokens
    print(
        f"\ndecode: step = (wall({n2} tokens) - wall({n1} tokens)) / {n2 - n1}, the fastest of {grid.repeats} "
        "runs each, prompts cached; bound = max(memory, compute)\n"
    )
    print("| batch | context | step ms | tokens/s | bound ms | of the bound | prompt cached |")
    print("|---|---|---|---|---|---|---|")
    for cell in decode:
        limit = bound(cell.batch, cell.context)
        if cell.step_s is None:
            print(f"| {cell.batch} | {cell.context} | skipped | | {limit * 1e3:.2f} | | |")
            continue
        print(
            f"| {cell.batch} | {cell.context} | {cell.step_s * 1e3:.1f} | {cell.batch / cell.step_s:.0f} "
            f"| {limit * 1e3:.2f} | {limit / cell.step_s:.0%} | {cell.cached:.0%} |"
        )
    print("\nprefill: max_tokens=1 requests submitted together; bound = compute at the prompt's mean context\n")
    print("| requests | tokens each | total tokens | seconds | tokens/s | bound s |\n|---|---|---|---|---|---|")
    for requests, tokens, seconds in prefill:
        limit = requests * tokens * shape.flops_per_token(tokens // 2) / flops
        print(
            f"| {requests} | {tokens} | {requests * tokens} | {seconds:.2f} | {requests * tokens / seconds:.0f} "
            f"| {limit:.2f} |"
        )
    memory_ms = weight_bytes / bandwidth * 1e3
    token_ms = shape.flops_per_token(0) / flops * 1e3
    print(
        f"\nhardware limit: {shape.parameters / 1e6:.1f}M parameters in {dtype} = {weight_bytes / 1e6:.0f} MB read "
        f"per decode step; stream bandwidth {bandwidth / 1e9:.1f} GB/s (numpy copy, {threads} threads) -> "
        f"{memory_ms:.1f} ms per step at least ({1e3 / memory_ms:.0f} steps/s: B x {1e3 / memory_ms:.0f} tokens/s); "
        f"matmul {flops / 1e9:.0f} GFLOP/s (torch {dtype}, 512x{shape.hidden} @ {shape.hidden}x{shape.intermediate}, "
        f"{torch.get_num_threads()} threads) -> {token_ms:.2f} ms per token at least ({1e3 / token_ms:.0f} tokens/s, "
        "the prefill's and a large batch's bound)"
    )


def main() -> None:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 1-minute smoke: batches 1 and 4, context 256")
    parser.add_argument("--batches", help="comma-separated decode batch sizes (default 1,2,4,8,16,32)")
    parser.add_argument("--contexts", help="comma-separated decode prompt lengths in tokens (default 256,1024,2048)")
    parser.add_argument(
        "--max-cell-tokens",
        type=int,
        default=16384,
        help="skip decode cells with more prompt tokens than this (batch x context)",
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    grid = Grid.default(args.quick)
    if args.batches:
        grid = replace(grid, batches=tuple(int(b) for b in args.batches.split(",")))
    if args.contexts:
        grid = replace(grid, contexts=tuple(int(c) for c in args.contexts.split(",")))
    config = config_from_args(args).engine
    config.max_model_len = max(config.max_model_len, grid.longest_request())
    engine = build_engine(config)
    try:
        decode, prefill = asyncio.run(measure(engine, grid, args.max_cell_tokens))
    finally:
        asyncio.run(engine.close())
    record = engine.describe()
    shape = ModelShape.read(Path(record["model_path"]))
    print_report(record, shape, " ".join(args.overrides) or f"the {args.config} preset", decode, prefill, grid)


if __name__ == "__main__":
    main()

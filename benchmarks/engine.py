"""Engine micro-benchmark: start time, tokens/s for concurrent Search-R1 prompts, prefix-cache hits of
probe prompts, regex warm-up time.

    python benchmarks/engine.py --prompts 24
    python benchmarks/engine.py --enforce-eager --cpu-threads 1     # no torch.compile, bound to core 1
    python benchmarks/engine.py --cpu-threads vllm                 # vLLM's binding: one core kept for its frontend
    python benchmarks/engine.py --block-size 128                    # vLLM's CPU default block

Prints one table row per run (and logs progress). Uses the first N bundled HotpotQA questions through
the chat template, greedy, stopping at ``</search>``/``</answer>``; then, for each, a probe prompt
(prompt + continuation + ``\\n\\n<answer>``) whose cached prompt tokens are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from raypipe.agents.search_r1 import PROMPT, SearchR1
from raypipe.core.config import AgentConfig, EngineConfig
from raypipe.data.loaders import load_questions
from raypipe.llm.base import GenerationRequest
from raypipe.llm.factory import build_engine

FORMAT = SearchR1().enforcement_regex(AgentConfig(enforcement="free"), 0)  # think, then search or answer


async def measure(engine, prompts: list[str], max_tokens: int, regex: bool) -> dict[str, float]:
    row: dict[str, float] = {}
    warm = await engine.warmup([FORMAT] if regex else [])
    row["warmup_s"] = warm[""]
    if regex:
        row["regex_compile_s"] = warm[FORMAT]
    started = time.perf_counter()
    gens = await asyncio.gather(
        *(
            engine.generate(GenerationRequest(prompt=p, max_tokens=max_tokens, stop=("</search>", "</answer>")))
            for p in prompts
        )
    )
    elapsed = time.perf_counter() - started
    tokens = sum(len(g.token_ids) for g in gens)
    row.update(gen_s=elapsed, tokens=tokens, tokens_per_s=tokens / elapsed)
    probes = [p + g.text + "\n\n<answer>" for p, g in zip(prompts, gens)]
    started = time.perf_counter()
    hits = await asyncio.gather(
        *(engine.generate(GenerationRequest(prompt=p, max_tokens=16, stop=("</answer>",))) for p in probes)
    )
    row["probe_s"] = time.perf_counter() - started
    row["probe_prompt_tokens"] = sum(h.prompt_tokens for h in hits)
    row["probe_cached_tokens"] = sum(h.cached_prompt_tokens or 0 for h in hits)
    if regex:
        started = time.perf_counter()
        forced = await asyncio.gather(
            *(engine.generate(GenerationRequest(prompt=p, max_tokens=max_tokens, regex=FORMAT)) for p in prompts)
        )
        elapsed = time.perf_counter() - started
        row["regex_tokens_per_s"] = sum(len(g.token_ids) for g in forced) / elapsed
        row["regex_search_share"] = sum("<search>" in g.text for g in forced) / len(forced)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--dtype", default="auto", help="engine.dtype (auto: float32 on CPUs without native bfloat16)")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=32, help="0 = vLLM's default")
    parser.add_argument(
        "--cpu-threads", default="all", help="engine.cpu_threads: all, a core list such as 1, or vllm (its own binding)"
    )
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--regex", action="store_true", help="also time the format regex's warm-up and enforced decoding"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    threads = None if args.cpu_threads == "vllm" else args.cpu_threads
    config = EngineConfig(
        backend=args.backend,
        dtype=args.dtype,
        max_model_len=4096,
        kv_cache_gib=1,
        block_size=args.block_size or None,
        cpu_threads=threads,
        enforce_eager=args.enforce_eager,
    )
    started = time.perf_counter()
    engine = build_engine(config)
    start_s = time.perf_counter() - started
    questions = load_questions("hotpotqa", limit=args.prompts)
    prompts = [
        engine.apply_chat_template([{"role": "user", "content": PROMPT.format(question=q.question)}]) for q in questions
    ]
    row = asyncio.run(measure(engine, prompts, args.max_tokens, args.regex))
    asyncio.run(engine.close())
    record = engine.describe()
    settings = (
        f"{args.backend} {record['dtype']} block={record.get('block_size', '-')} eager={args.enforce_eager} "
        f"threads={args.cpu_threads}"
    )
    print(
        f"{settings}: start {start_s:.1f} s | "
        + " | ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
    )


if __name__ == "__main__":
    main()

"""Benchmark of the probe stage: throughput, probing overhead, speed-up over a sequential baseline, memory.

On the same questions, model and retriever (the config's; in-process retrieval so only generation is
timed) it runs, each on a fresh engine so no run inherits another's prefix cache:

1. ``probe``: the configured stage (concurrent trajectories, prefix caching, probing on);
2. ``no-probe``: the same with probing off -> probing overhead = wall(probe) / wall(no-probe);
3. ``sequential``: the baseline of Search-R1's ``infer.py`` and the seed paper's code: one question at
   a time, the whole context re-encoded at every turn and every probe (prefix caching off,
   concurrency 1), probing on; on ``--baseline-questions`` of the questions only (it is slow), evenly
   spaced over the list so every dataset is in.

It prints trajectories/min, generated tokens/s (agent + probe tokens), engine start time (separately),
prompt tokens served from the prefix cache and those prefilled, the targets' quality checks, and the
peak memory (PSS, and summed RSS) of the whole process tree (vLLM's engine process included).
``--job`` also runs ``jobs/probe.py`` with the same settings into a scratch run directory and reports
its wall time and peak memory.

    python benchmarks/probe.py [--config PRESET] [--set KEY=VALUE ...] [--limit N] [--job]
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

from raypipe.agents import TrajectoryOutput
from raypipe.core.config import RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.data.loaders import load_datasets
from raypipe.llm.base import Generation, GenerationRequest

log = logging.getLogger("benchmarks.probe")


class MemorySampler:
    """Peak memory of a process and all its descendants, sampled every ``interval`` seconds.

    ``peak_rss`` sums resident sets, so pages shared between processes (the torch and vLLM libraries
    every Ray worker maps, the shared-memory object store) count once per process; ``peak_pss`` sums
    proportional set sizes, which split each shared page among its sharers: the tree's physical memory.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.5):
        self.root = psutil.Process(pid or os.getpid())
        self.interval = interval
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree_memory(self) -> tuple[int, int]:
        rss = pss = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            rss, pss = rss + info.rss, pss + info.pss
        return rss, pss

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss, pss = self._tree_memory()
            except psutil.Error:
                return
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop.wait(self.interval)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Recorder:
    """Wraps an engine and counts tokens: generated, prompt, and prompt tokens served from the cache."""

    engine: object
    generated: int = 0
    prompt: dict = field(default_factory=lambda: {"turn": 0, "probe": 0})
    cached: dict = field(default_factory=lambda: {"turn": 0, "probe": 0})

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, request: GenerationRequest) -> Generation:
        gen = await self.engine.generate(request)
        kind = "probe" if request.logprobs else "turn"
        self.generated += len(gen.token_ids)
        self.prompt[kind] += gen.prompt_tokens
        self.cached[kind] += gen.cached_prompt_tokens or 0
        return gen


@dataclass
class Result:
    name: str
    questions: int
    engine_start_s: float
    wall_s: float
    generated: int
    prompt: dict
    cached: dict
    outputs: list[TrajectoryOutput]

    @property
    def per_min(self) -> float:
        return self.questions / self.wall_s * 60

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s


def run_variant(name: str, config: RunConfig, questions, retriever) -> Result:
    from raypipe.llm.factory import build_engine
    from raypipe.stages.probe import GenerateStage

    recorders = []

    def factory(engine_config):
        recorders.append(Recorder(build_engine(engine_config)))
        return recorders[-1]

    log.info("%s: starting an engine", name)
    stage = GenerateStage(config, retriever, engine_factory=factory)
    started = time.perf_counter()
    outputs = stage.run(questions)
    wall = time.perf_counter() - started
    stage.close()
    rec = recorders[0]
    result = Result(name, len(questions), stage.engine_start_s, wall, rec.generated, rec.prompt, rec.cached, outputs)
    log.info("%s: %d trajectories in %.1f s (%.1f/min, %.1f generated tokens/s, engine start %.1f s), %s", name,
             len(outputs), wall, result.per_min, result.tokens_per_s, stage.engine_start_s, quality(outputs))  # fmt: skip
    return result


def quality(outputs: list[TrajectoryOutput]) -> dict[str, float]:
    n = len(outputs)
    iterations = [row for o in outputs for row in o.iterations]
    return {
        "with >=1 retrieval": sum(o.trajectory["n_iterations"] >= 1 for o in outputs) / n,
        "ended with own answer": sum(o.trajectory["stop_reason"] == "answer" for o in outputs) / n,
        "iterations with probe F1": sum(r["probe_f1"] is not None for r in iterations) / max(len(iterations), 1),
        "final F1": sum(o.trajectory["final_f1"] for o in outputs) / n,
        "mean retrieval iterations": sum(o.trajectory["n_iterations"] for o in outputs) / n,
    }


def run_job(args, overrides: list[str]) -> tuple[float, MemorySampler, int]:
    """The main job as a subprocess: (wall s, its process tree's memory, exit code)."""
    out = tempfile.mkdtemp(prefix="raypipe-bench-")
    cmd = [sys.executable, str(REPO / "jobs" / "probe.py"), "--config", args.config, "--out", out]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with MemorySampler(proc.pid) as memory:
        code = proc.wait()
    return time.perf_counter() - started, memory, code


def evenly_spaced(items: list, count: int) -> list:
    """``count`` items spread evenly over ``items`` (all of them when there are no more)."""
    if count >= len(items):
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB ({size / 1e9:.2f} GB)"


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("--limit", type=int, help="questions per dataset (default: the config's data.limit)")
    parser.add_argument("--baseline-questions", type=int, default=6, help="questions the sequential baseline runs")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--job", action="store_true", help="also run jobs/probe.py and measure it")
    args = parser.parse_args()
    setup_logging(args.verbose)
    extra = [f"data.limit={args.limit}", "data.limit_files=true"] if args.limit else []
    config = config_from_args(args, extra)
    questions = load_datasets(config.data.datasets, config.data.limit, config.data.limit_files)

    from raypipe.retrieval import LocalRetriever, encoder_spec, search_params
    from raypipe.stages.index import ensure_index

    retriever = LocalRetriever.open(ensure_index(config, use_ray=False), encoder_spec(config.retrieval), search_params(config.retrieval))
    no_probe = config.model_copy(deep=True)
    no_probe.agent.probe = False
    sequential = config.model_copy(deep=True)
    sequential.engine.enable_prefix_caching = False
    sequential.generation.max_concurrent_trajectories = 1

    with MemorySampler() as memory:
        results = [run_variant("probe", config, questions, retriever), run_variant("no-probe", no_probe, questions, retriever)]
        if not args.skip_baseline:
            baseline = evenly_spaced(questions, args.baseline_questions)
            results.append(run_variant("sequential", sequential, baseline, retriever))

    probe, off = results[0], results[1]
    print(f"\n{len(questions)} questions ({', '.join(config.data.datasets)}), model {config.engine.model} on "
          f"{config.engine.backend}, enforcement {config.agent.enforcement}, protocol {config.agent.protocol}\n")
    head = (f"{'run':<12}{'questions':>10}{'engine start s':>16}{'wall s':>9}{'traj/min':>10}{'gen tok/s':>11}"
            f"{'cached prompt':>15}{'prefilled tok/traj':>20}")
    print(head)
    print("-" * len(head))
    for r in results:
        total_prompt = sum(r.prompt.values())
        cached = sum(r.cached.values()) / total_prompt if total_prompt else 0.0
        prefilled = (total_prompt - sum(r.cached.values())) / r.questions
        print(f"{r.name:<12}{r.questions:>10}{r.engine_start_s:>16.1f}{r.wall_s:>9.1f}{r.per_min:>10.1f}"
              f"{r.tokens_per_s:>11.1f}{cached:>14.0%}{prefilled:>20.0f}")
    print()
    probe_cached = probe.cached["probe"] / probe.prompt["probe"] if probe.prompt["probe"] else 0.0
    print(f"probe prompts served from the prefix cache: {probe_cached:.0%}")
    overhead = probe.wall_s / off.wall_s
    print(f"probing overhead (wall with probing / without): {overhead:.2f}x   (target <= 1.25x)")
    if len(results) > 2:
        print(f"speed-up over the sequential baseline (trajectories/min): {probe.per_min / results[2].per_min:.1f}x   (target >= 5x)")
    print(f"peak memory of the process tree: {gib(memory.peak_pss)} PSS ({gib(memory.peak_rss)} summed RSS)"
          "   (target < 8 GB)")
    for key, value in quality(probe.outputs).items():
        print(f"{key}: {value:.2f}" if "F1" in key or "mean" in key else f"{key}: {value:.0%}")
    if args.job:
        wall, job_memory, code = run_job(args, [*args.overrides, *extra])
        print(f"jobs/probe.py: exit {code}, wall {wall:.1f} s, peak memory {gib(job_memory.peak_pss)} PSS "
              f"({gib(job_memory.peak_rss)} summed RSS)")


if __name__ == "__main__":
    main()

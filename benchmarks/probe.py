"""Benchmark of the probe stage against the peers' schedules: throughput, probing overhead, cost, memory.

Every variant runs on the same questions, the same engine settings (its prefix cache emptied before each
run, so no run inherits another's) and the same retriever (in process, behind the batcher a retrieval
replica runs), ``--repeats`` times in alternating order (forward, backward, ...). One vLLM engine is alive
at a time: raypipe's async engine, or vLLM's offline ``LLM`` for ``offline-turn-sync`` (that variant runs
last in the order, so the engine changes as seldom as the alternation allows); each start is timed.

* ``probe``: the stage (raypipe.runtime.generation.TrajectoryGenerator, a generation actor's body):
  per-trajectory asynchronous loops on one engine, a turn's search and its trajectory's next turns beside its
  probe (``agent.probe_overlap``), prefix caching, probing on;
* ``no-probe``: the same with probing off -> probing overhead = wall(probe) / wall(no-probe);
* ``probe-first``: the stage with each probe run before its trajectory's next turn (``agent.probe_overlap=false``,
  the schedule before the overlap, and the one an online controller needs) -> its own probing overhead;
* ``turn-sync``: the peers' schedule (pyterrier-rag's agents, Search-R1's ``generation.py``) on raypipe's
  own engine and retriever (raypipe.agents.barrier.TurnBarrier): per turn one batch of generations for
  all live trajectories, then one batch of searches, then one batch of probes; prefix caching on,
  probing on;
* ``offline-turn-sync``: the peers' own design, the same schedule on vLLM's offline ``LLM`` as pyterrier-rag's
  ``VLLMBackend`` and Search-R1's ``generation.py`` use it: per turn ONE blocking ``LLM.generate`` over
  every live trajectory, then one batch of searches, then one ``LLM.generate`` for all the probes
  (``offline_engine.py`` here: the async engine's settings, environment and request parameters);
* ``sequential`` (with ``--sequential-questions N``): Search-R1's ``infer.py`` and the seed paper's code:
  one question at a time, the whole context re-encoded by every request (the prefix cache emptied
  before each), probing on; on N of the questions, evenly spaced, and ``probe`` is timed on the same N.

It prints one row per variant (median over repeats, and the spread): trajectories/min, tokens, the
prompt tokens served from the prefix cache and those prefilled, retrieval and engine seconds (from the
cost columns of iterations/, raypipe.core.schema.ITERATION_COSTS); the ratios with their per-repeat
range; for the lock-step variants, how full the barrier leaves the decode slots; how many agent transcripts
differ between variants (probing must not change the agent's own turns; batch numerics may;
``--show-differences`` lists where each first differs); per variant, the rows against the engine's own counters
(vLLM's Prometheus totals of prompt, cached and generated tokens and finished requests over the run: counted by
its scheduler, not derived from the rows) and its steps (how many, the tokens each computed, wall ms per step,
preemptions), and a model of those steps from the rows (:func:`modelled_steps`: prefill, the scheduler's limits
read from the engine, the probes beside or before the next turns, the barrier) against the engine's count on
every run, flagged MISMATCH where off by more than 10%; from that model, what the barrier and the probes before
the next turns cost in engine steps on the same rows; the engine's counted steps of each variant over the
stage's (the ratio of engine time only where a step costs the same whatever it holds); the engine's work with
probing over without (tokens computed and steps, by its counters); the CPU seconds of the process tree per run
and the machine's steal time over it (CPU seconds near cores x wall say the run kept the cores busy, steal says
whether the hypervisor took them: where the spread between repeats comes from; on busy cores a ratio of CPU
seconds is the wall's ratio again, so none is printed); the peak memory (PSS, and summed RSS) of the whole
process tree. ``--job`` also runs ``jobs/probe.py`` and reports its wall and memory.

    python benchmarks/probe.py [--config PRESET] [--set KEY=VALUE ...] [--limit N] [--repeats 3]
        [--variants probe,offline-turn-sync] [--show-differences] [--job]
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import psutil

from raypipe.agents import TrajectoryOutput
from raypipe.core.config import RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.data.loaders import load_datasets
from raypipe.llm.base import Generation, GenerationRequest

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks.probe")


class MemorySampler:
    """Peak memory of a process and all its descendants, sampled every ``interval`` seconds.

    ``peak_rss`` sums resident sets, so pages shared between processes (the torch and vLLM libraries
    every Ray worker maps, the shared-memory object store) count once per process; ``peak_pss`` sums
    proportional set sizes, which split each shared page among its sharers: the tree's physical memory.
    """

    # Every 2 s: reading the smaps of vLLM's processes is not free (at 0.5 s it took 6% of all the CPU
    # samples of a profiled run on 2 cores), and the peak is a plateau (the KV cache is allocated at start).
    def __init__(self, pid: int | None = None, interval: float = 2.0):
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

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class SharedEngine:
    """The one engine of the benchmark, lent to each run: counts what the engine reports, never closes it.

    ``reprefill`` empties the prefix cache before every request (the sequential baseline's re-encoding).
    """

    def __init__(self, engine, reprefill: bool = False):
        self.engine, self.reprefill = engine, reprefill
        self.requests = self.generated = self.prompt = self.cached = 0

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def supports_regex(self) -> bool:
        return self.engine.supports_regex

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.engine.apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text)

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        return await self.engine.warmup(regexes)

    async def reset_prefix_cache(self) -> bool:
        return await self.engine.reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.reprefill:
            await self.engine.reset_prefix_cache()
        gen = await self.engine.generate(request)
        self.requests += 1
        self.generated += len(gen.token_ids)
        self.prompt += gen.prompt_tokens
        self.cached += gen.cached_prompt_tokens or 0
        return gen

    async def close(self) -> None:
        pass


ASYNC_ENGINE, OFFLINE_LLM = "async engine", "offline LLM"


class Engines:
    """The benchmark's engine, started when a run needs it: raypipe's async engine, or vLLM's offline ``LLM`` for
    offline-turn-sync. One at a time: two do not fit one GPU at the configured memory share, and the engine started
    last takes vLLM's Prometheus counters over. Each start is timed (``starts``), then warmed up as the stage warms
    its engine (the enforcement grammars compiled), so that no timed run compiles them."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.starts: dict[str, list[float]] = {ASYNC_ENGINE: [], OFFLINE_LLM: []}
        self.kind: str | None = None
        self.engine: Any = None

    def get(self, kind: str) -> Any:
        if kind != self.kind:
            from offline_engine import start_offline_engine  # benchmarks/: the script's own folder

            from raypipe.agents import build_protocol
            from raypipe.llm.factory import build_engine
            from raypipe.runtime.generation import prepare_engine

            self.close()
            started = time.perf_counter()
            start = start_offline_engine if kind == OFFLINE_LLM else build_engine
            self.engine, self.kind = start(self.config.engine), kind
            self.starts[kind].append(time.perf_counter() - started)
            asyncio.run(prepare_engine(self.engine, self.config, build_protocol(self.config.agent)))
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            asyncio.run(self.engine.close())
        self.engine = self.kind = None


@dataclass
class Result:
    name: str
    repeat: int
    wall_s: float
    outputs: list[TrajectoryOutput]
    engine: SharedEngine
    counters: dict[str, float] | None = None  # the engine's own totals over the run (engine_counters), if it keeps any
    cpu_s: float | None = None  # CPU seconds of this process tree over the run (tree_cpu_seconds)
    steal_s: float | None = None  # CPU seconds the hypervisor gave other guests over the run (steal_seconds)
    batches: list[int] | None = None  # offline-turn-sync: the requests of each LLM.generate call
    limits: Limits | None = None  # the engine's scheduler limits (scheduler_limits), for the step model

    @property
    def questions(self) -> int:
        return len(self.outputs)

    @property
    def per_min(self) -> float:
        return self.questions / self.wall_s * 60

    def total(self, column: str) -> float:
        """A cost column summed over the trajectory rows (nulls as 0)."""
        return sum(o.trajectory[column] or 0 for o in self.outputs)

    def iteration_total(self, column: str) -> float:
        return sum(r[column] or 0 for o in self.outputs for r in o.iterations)

    @property
    def transcripts(self) -> dict[str, str]:
        return {o.trajectory["qid"]: o.trajectory["transcript"] for o in self.outputs}


OFFLINE = "offline-turn-sync"
VARIANTS = ("probe", "no-probe", "probe-first", "turn-sync", OFFLINE)
LOCKSTEP = ("turn-sync", OFFLINE)  # the variants under a turn barrier


def variant_config(name: str, config: RunConfig) -> RunConfig:
    variant = config.model_copy(deep=True)
    if name == "no-probe":
        variant.agent.probe = False
    if name == "probe-first":
        variant.agent.probe_overlap = False
    if name == "sequential":
        variant.generation.max_concurrent_trajectories = 1
    return variant


def run_variant(name: str, repeat: int, config: RunConfig, questions, engine, index) -> Result:
    """One run of a variant on a fresh retriever front and an empty prefix cache."""
    from raypipe.agents import build_loop
    from raypipe.agents.barrier import TurnBarrier
    from raypipe.retrieval import QueryBatcher
    from raypipe.runtime.generation import TrajectoryGenerator

    config = variant_config(name, config)
    retriever = QueryBatcher(
        index.search_batch, config.retrieval.actors.max_batch_size, config.retrieval.actors.max_wait_ms / 1000
    )
    asyncio.run(engine.reset_prefix_cache())
    shared = SharedEngine(engine, reprefill=name == "sequential")
    if name in LOCKSTEP:

        async def lock_step():
            parties = len(questions)
            barrier = engine.lockstep_barrier(parties) if name == OFFLINE else TurnBarrier(parties)
            loop = build_loop(config, shared, retriever, barrier=barrier)
            return list(await asyncio.gather(*(loop.run(q) for q in questions)))

        before = settled_counters()
        cpu, steal, started = tree_cpu_seconds(), steal_seconds(), time.perf_counter()
        outputs = asyncio.run(lock_step())
    else:
        stage = TrajectoryGenerator(config, retriever, engine_factory=lambda _: shared)
        before = settled_counters()  # after the stage's engine warm-up, whose requests have no rows
        cpu, steal, started = tree_cpu_seconds(), steal_seconds(), time.perf_counter()
        outputs = stage.run(questions)
        stage.close()
    result = Result(
        name,
        repeat,
        time.perf_counter() - started,
        outputs,
        shared,
        cpu_s=tree_cpu_seconds() - cpu,
        steal_s=steal_seconds() - steal,
    )
    if name == OFFLINE:
        result.batches = list(engine.batch_sizes)
    result.limits = scheduler_limits(engine)
    after = settled_counters()
    if before is not None and after is not None:
        result.counters = {key: after[key] - before[key] for key in after}
    log.info(
        "%s (repeat %d): %d trajectories in %.1f s (%.1f/min)",
        name,
        repeat,
        len(outputs),
        result.wall_s,
        result.per_min,
    )
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


# vLLM's Prometheus counters (raypipe's key -> metric): kept by its scheduler and output processor in this
# process while it records stats (engine.request_timings, the default), whatever raypipe writes in its rows.
# The values are (metric, sample): a counter's running total, or a histogram's count of observations (one
# per engine step for the tokens a step computed).
VLLM_COUNTERS = {
    "prompt": ("vllm:prompt_tokens", "vllm:prompt_tokens_total"),
    "cached": ("vllm:prompt_tokens_cached", "vllm:prompt_tokens_cached_total"),
    "generated": ("vllm:generation_tokens", "vllm:generation_tokens_total"),
    "requests": ("vllm:request_success", "vllm:request_success_total"),
    "steps": ("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count"),
    "preemptions": ("vllm:num_preemptions", "vllm:num_preemptions_total"),
}


def engine_counters(registry=None) -> dict[str, float] | None:
    """The engine's own running totals (:data:`VLLM_COUNTERS`, summed over their labels); None where it keeps
    none (another backend, or vLLM with its stats off)."""
    from prometheus_client import REGISTRY

    totals = {}
    for metric in (registry or REGISTRY).collect():
        for key, (name, sample) in VLLM_COUNTERS.items():
            if metric.name == name:
                totals[key] = sum(s.value for s in metric.samples if s.name == sample)
    return totals if totals.keys() == VLLM_COUNTERS.keys() else None


def settled_counters(registry=None, wait_s: float = 0.2, limit_s: float = 5.0) -> dict[str, float] | None:
    """:func:`engine_counters` once two reads ``wait_s`` apart agree (vLLM records a step's stats just after it
    hands the step's outputs to the requests, so the last step of a run may not be counted yet)."""
    last, deadline = engine_counters(registry), time.monotonic() + limit_s
    while last is not None and time.monotonic() < deadline:
        time.sleep(wait_s)
        now = engine_counters(registry)
        if now == last:
            break
        last = now
    return last


def counter_problems(result: Result) -> list[str] | None:
    """Where the rows disagree with the engine's own counters over the run (empty: they agree; None: the
    engine keeps no counters). Prompt and cached tokens and requests must be equal; the rows' generated
    tokens (turns and probes) may not exceed the engine's (it may decode past a stop string before the
    request ends, tokens no row holds)."""
    engine = result.counters
    if engine is None:
        return None
    rows = {
        "prompt": result.iteration_total("prompt_tokens"),
        "cached": result.iteration_total("cached_tokens"),
        "generated": result.iteration_total("tokens_generated") + result.iteration_total("probe_tokens"),
        "requests": result.engine.requests,  # generate calls the run made
    }
    where = f"{result.name} (repeat {result.repeat})"
    problems = [
        f"{where}: {key} {rows[key]:,.0f} in the rows, {engine[key]:,.0f} by the engine"
        for key in ("prompt", "cached", "requests")
        if rows[key] != engine[key]
    ]
    if rows["generated"] > engine["generated"]:
        problems.append(
            f"{where}: generated {rows['generated']:,.0f} in the rows, more than the engine's "
            f"{engine['generated']:,.0f}"
        )
    return problems


def step_summary(runs: list[Result]) -> str:
    """The engine's steps per run and what a step did and cost, median over the runs: the cost model's terms
    (a step's wall time is the run's wall over its steps, retrieval waits included)."""
    steps = [r.counters["steps"] for r in runs]
    computed = [r.counters["prompt"] - r.counters["cached"] + r.counters["generated"] for r in runs]
    return (
        f"{median(steps):,.0f} per run ({spread(steps, ',.0f')}), "
        f"{median([c / s for c, s in zip(computed, steps)]):.1f} tokens computed per step, "
        f"{median([r.wall_s / s * 1000 for r, s in zip(runs, steps)]):.1f} ms of wall per step, "
        f"{median([r.counters['preemptions'] for r in runs]):.0f} preemptions"
    )


def tree_cpu_seconds(root: psutil.Process | None = None) -> float:
    """User and system CPU seconds of ``root`` (default: this process) and of every live process under it
    (vLLM's EngineCore)."""
    root = root or psutil.Process()
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def steal_seconds() -> float:
    """The machine's CPU seconds stolen by the hypervisor for other guests so far (0 where not reported)."""
    return getattr(psutil.cpu_times(), "steal", 0.0)


def cpu_summary(runs: list[Result]) -> str:
    """CPU seconds of the process tree and the machine's steal per run, median and range over the runs."""
    cpu, steal = [r.cpu_s for r in runs], [r.steal_s for r in runs]
    return (
        f"{median(cpu):.1f} CPU s of the process tree ({spread(cpu)}), "
        f"{median(steal):.1f} s stolen from the machine ({spread(steal)})"
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float], fmt: str = ".1f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}" if len(values) > 1 else "-"


def differing(a: Result, b: Result) -> int:
    ta, tb = a.transcripts, b.transcripts
    return sum(ta[q] != tb.get(q) for q in ta)


@dataclass
class Difference:
    """Where one question's agent transcript first differs between two runs."""

    qid: str
    iteration: int | None  # the first row whose agent output differs; None: every row agrees, what followed differs
    a: str  # a window of each run's text from a few characters before the first differing one
    b: str


def first_difference(x: str, y: str, before: int = 10, after: int = 50) -> tuple[str, str]:
    """Windows of two texts around the first character where they differ."""
    at = len(os.path.commonprefix([x, y]))
    start = max(at - before, 0)
    return x[start : at + after], y[start : at + after]


def transcript_differences(a: Result, b: Result) -> list[Difference]:
    """Per question whose agent transcript differs (:func:`differing`): the first iteration whose agent output (the
    row's ``reasoning``) differs, a row missing in one run counting as empty, and windows of the two outputs there;
    where every row agrees (the documents read or the forced answer differ), windows of the two transcripts."""
    rows_a, rows_b = ({o.trajectory["qid"]: o.iterations for o in r.outputs} for r in (a, b))
    ta, tb = a.transcripts, b.transcripts
    out = []
    for qid, transcript in ta.items():
        other = tb.get(qid, "")
        if transcript == other:
            continue
        pairs = list(
            zip_longest(
                (r["reasoning"] for r in rows_a[qid]), (r["reasoning"] for r in rows_b.get(qid, [])), fillvalue=""
            )
        )
        iteration = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
        x, y = (transcript, other) if iteration is None else pairs[iteration]
        out.append(Difference(qid, iteration, *first_difference(x, y)))
    return out


def _lockstep_phases(rows: Iterable[dict]) -> dict[tuple[int, str], list[int]]:
    """The tokens decoded in each phase of a turn under a turn barrier: turn t's generations (row ``iteration`` t,
    ``tokens_generated``), then its probes (``probe_tokens``); a row that generated nothing in a phase (a turn
    without a probe, a forced answer's turn) is not in it."""
    phases: dict[tuple[int, str], list[int]] = {}
    for row in rows:
        for column in ("tokens_generated", "probe_tokens"):
            if row[column]:
                phases.setdefault((row["iteration"], column), []).append(row[column])
    return phases


def lockstep_fill(rows: Iterable[dict]) -> float:
    """What a turn barrier leaves filled of the engine's decode slots on these trajectories' iteration rows.

    The barrier keeps every live trajectory at the same turn and phase (:func:`_lockstep_phases`). In each phase
    every trajectory in it holds a slot until the longest generation of the phase ends, so the phase fills
    sum(tokens) of max(tokens) x trajectories; the fill is the sum over phases of the one over the sum of the
    other. 1.0: equal generations, no slot idles. It describes the idle slots, not what they cost: 1 / fill is
    neither a bound on nor an estimate of what dropping the barrier gains (:func:`modelled_steps` is)."""
    phases = _lockstep_phases(rows)
    held = sum(max(tokens) * len(tokens) for tokens in phases.values())
    return sum(map(sum, phases.values())) / held if held else 1.0


@dataclass
class Limits:
    """The engine scheduler's limits per step (vLLM's ``SchedulerConfig``): tokens, sequences, chunked prefill."""

    tokens: int
    seqs: int
    chunked: bool = True


def scheduler_limits(engine: Any) -> Limits | None:
    """The limits of a vLLM engine: raypipe's async engine or the offline ``LLM`` (None for another engine)."""
    vllm = getattr(engine, "_llm", None) or getattr(getattr(engine, "llm", None), "llm_engine", None)
    scheduler = getattr(getattr(vllm, "vllm_config", None), "scheduler_config", None)
    if scheduler is None:
        return None
    return Limits(scheduler.max_num_batched_tokens, scheduler.max_num_seqs, bool(scheduler.enable_chunked_prefill))


@dataclass
class _Request:
    prefill: int  # prompt tokens the engine computes (at least 1: vLLM recomputes the last of a cached prompt)
    generate: int  # tokens it samples (at least 1)
    trajectory: int
    after: list[int]  # the requests that must end before this one is sent


OVERLAP, PROBE_FIRST, LOCKSTEP_SCHEDULE = "overlap", "probe-first", "lock-step"


def _requests(rows: Iterable[dict], schedule: str) -> list[_Request]:
    """The requests behind the iteration rows, each with what it waits for under ``schedule``.

    A row holds its turn's request (``prompt_tokens`` less the probe's, ``tokens_generated``) and its probe's
    (``probe_prompt_tokens``, ``probe_tokens``); a row with no turn prompt is a forced answer, sent once every
    earlier request of its trajectory ended. ``overlap`` (the stage with ``agent.probe_overlap``): each turn
    after the turn before, each probe after its turn, beside the next turns; ``probe-first``: turns and probes
    one after another; ``lock-step``: every request of a phase (turn t's generations, then its probes) after every
    request of the phase before, whatever its trajectory."""
    trajectories: dict[str, list[dict]] = {}
    for row in rows:
        trajectories.setdefault(row["qid"], []).append(row)
    requests: list[_Request] = []
    phases: dict[tuple[int, int], list[int]] = {}
    for t, qid in enumerate(trajectories):
        mine: list[int] = []
        last_turn: int | None = None
        for row in sorted(trajectories[qid], key=lambda r: r["iteration"]):
            probe_prompt, probe_cached = row.get("probe_prompt_tokens") or 0, row.get("probe_cached_tokens") or 0
            turn_prompt = (row["prompt_tokens"] or 0) - probe_prompt
            turn_cached = (row["cached_tokens"] or 0) - probe_cached
            parts = []
            if turn_prompt > 0:
                parts.append((0, turn_prompt - turn_cached, row["tokens_generated"]))
            if probe_prompt > 0:
                parts.append((1, probe_prompt - probe_cached, row["probe_tokens"]))
            for kind, prefill, generate in parts:
                if schedule == LOCKSTEP_SCHEDULE or schedule == PROBE_FIRST:
                    after = mine[-1:]
                elif kind == 0:
                    after = [last_turn] if last_turn is not None else []
                else:
                    after = [last_turn] if turn_prompt > 0 else list(mine)  # a forced answer joins every probe
                index = len(requests)
                requests.append(_Request(max(prefill, 1), max(generate or 0, 1), t, after))
                phases.setdefault((row["iteration"], kind), []).append(index)
                mine.append(index)
                if kind == 0:
                    last_turn = index
    if schedule == LOCKSTEP_SCHEDULE:
        before: list[int] = []
        for key in sorted(phases):
            for index in phases[key]:
                requests[index].after = list(before)
            before = phases[key]
    return requests


def modelled_steps(
    rows: Iterable[dict], schedule: str, limits: Limits, concurrency: int | None = None, lag: int = 1
) -> int:
    """The engine steps a run of these rows takes under ``schedule`` (:func:`_requests`), as vLLM's scheduler
    forms them: each step first gives every running request its next token (or its next prefill chunk), then
    admits waiting requests in arrival order while tokens (``limits.tokens``) and sequences (``limits.seqs``)
    remain, a prompt in chunks where ``limits.chunked`` (else whole, or not yet); the step that ends a prompt
    samples its first token. A request is sent ``lag`` steps after the last one it waits for ended (the agent's
    parsing and search between them), and at most ``concurrency`` trajectories are in flight (None: all). Steps in
    which nothing is scheduled are not engine steps and are not counted."""
    requests = _requests(rows, schedule)
    n = len(requests)
    waits = [len(r.after) for r in requests]
    followers: list[list[int]] = [[] for _ in range(n)]
    for i, r in enumerate(requests):
        for j in r.after:
            followers[j].append(i)
    open_requests: dict[int, int] = {}
    for r in requests:
        open_requests[r.trajectory] = open_requests.get(r.trajectory, 0) + 1
    admitted: set[int] = set()
    queue = sorted(open_requests)  # trajectories not yet admitted, in order
    limit = concurrency or len(queue) or 1
    ready_at = {i: 0 for i in range(n) if waits[i] == 0}
    waiting: list[int] = []
    running: list[int] = []
    left = [r.prefill for r in requests]
    sampled = [0] * n
    step = counted = done = 0
    while done < n:
        while queue and len(admitted) < limit:
            admitted.add(queue.pop(0))
        for i in sorted(i for i, at in ready_at.items() if at <= step and requests[i].trajectory in admitted):
            waiting.append(i)
            del ready_at[i]
        budget, scheduled = limits.tokens, {}
        for i in running:
            take = min(left[i] or 1, budget)
            if take == 0:
                break
            scheduled[i], budget = take, budget - take
        while waiting and len(running) < limits.seqs and budget > 0:
            i = waiting[0]
            take = min(left[i], budget) if limits.chunked else (left[i] if left[i] <= budget else 0)
            if take == 0:
                break
            waiting.pop(0)
            running.append(i)
            scheduled[i], budget = take, budget - take
        if scheduled:
            counted += 1
        for i, take in scheduled.items():
            if left[i]:
                left[i] -= take
                if left[i]:
                    continue
            sampled[i] += 1
            if sampled[i] < requests[i].generate:
                continue
            running.remove(i)
            done += 1
            trajectory = requests[i].trajectory
            open_requests[trajectory] -= 1
            if not open_requests[trajectory]:
                admitted.discard(trajectory)
            for f in followers[i]:
                waits[f] -= 1
                if not waits[f]:
                    ready_at[f] = step + 1 + lag
        step += 1
    return counted


def schedule_of(name: str, config: RunConfig) -> tuple[str, int | None]:
    """The step model's schedule of a variant and how many trajectories it keeps in flight (None: all)."""
    if name in LOCKSTEP:
        return LOCKSTEP_SCHEDULE, None
    variant = variant_config(name, config)
    overlap = variant.agent.probe and variant.agent.probe_overlap
    return (OVERLAP if overlap else PROBE_FIRST), variant.generation.max_concurrent_trajectories


STEP_TOLERANCE = 0.10  # a model off the engine's count by more than this is flagged


def step_check(runs: list[Result], schedule: str, concurrency: int | None, tolerance: float = STEP_TOLERANCE) -> str:
    """The step model against the engine's own step count, run by run: modelled/counted per run, and MISMATCH
    where any run's model is off by more than ``tolerance`` of the count (the model's figures are then not to be
    relied on for that variant)."""
    pairs = [(modelled_steps(iteration_rows(r), schedule, r.limits, concurrency), r.counters["steps"]) for r in runs]
    worst = max(abs(m - c) / c if c else float(m != c) for m, c in pairs)
    verdict = "ok" if worst <= tolerance else "MISMATCH"
    return (
        f"{', '.join(f'{m:,.0f}/{c:,.0f}' for m, c in pairs)} modelled/counted per run, off by at most "
        f"{worst:.1%}: {verdict} (tolerance {tolerance:.0%})"
    )


def iteration_rows(result: Result) -> list[dict]:
    return [row for o in result.outputs for row in o.iterations]


def modelled_gain(rows: list[dict], limits: Limits, slow: str, fast: str, concurrency: int | None = None) -> float:
    """Engine steps of ``slow`` over those of ``fast`` on the same rows (:func:`modelled_steps`)."""
    fast_steps = modelled_steps(rows, fast, limits, concurrency)
    return modelled_steps(rows, slow, limits, concurrency) / fast_steps if fast_steps else 1.0


def counted_ratio(a: list[Result], b: list[Result], key: str) -> list[float]:
    """Per repeat, the engine's own count ``key`` of run b over run a (tokens: computed, prompt - cached +
    generated)."""

    def value(r: Result) -> float:
        c = r.counters
        return c["prompt"] - c["cached"] + c["generated"] if key == "computed" else c[key]

    return [value(y) / value(x) for x, y in zip(a, b)]


def print_report(
    results: list[Result], config: RunConfig, engine_starts: dict[str, list[float]], show_differences: bool = False
) -> None:
    by_name: dict[str, list[Result]] = {}
    for r in results:
        by_name.setdefault(r.name, []).append(r)
    first = results[0]
    starts = ", ".join(
        f"{kind} started {len(seconds)}x, {median(seconds):.1f} s" for kind, seconds in engine_starts.items() if seconds
    )
    from first_run import cpu_description  # benchmarks/: the script's own folder

    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}; {cores} cores; flags: {flags}")
    print(
        f"{first.questions} questions ({', '.join(config.data.datasets)}), model {config.engine.model} on "
        f"{config.engine.backend} ({starts}), enforcement "
        f"{config.agent.enforcement}, protocol {config.agent.protocol}, {len(by_name[first.name])} repeats; "
        "per trajectory: median over repeats\n"
    )
    head = (
        f"{'run':<18}{'n':>4}{'wall s':>8}{'(range)':>13}{'traj/min':>10}{'gen tok/s':>10}{'prompt tok':>11}"
        f"{'cached':>8}{'prefilled':>10}{'turn tok':>9}{'probe tok':>10}{'retr s':>8}{'engine s':>9}{'F1':>7}"
    )
    print(head)
    print("-" * len(head))
    for name, runs in by_name.items():
        n = runs[0].questions
        walls = [r.wall_s for r in runs]

        def per(column, runs=runs, n=n):
            return median([r.total(column) / n for r in runs])

        prompt = median([r.total("prompt_tokens") for r in runs])
        cached = median([r.total("cached_tokens") for r in runs])
        gen_rate = median([(r.total("tokens_generated") + r.total("probe_tokens")) / r.wall_s for r in runs])
        engine_s = (
            "null" if all(o.trajectory["engine_s"] is None for o in runs[0].outputs) else f"{per('engine_s'):.2f}"
        )
        f1 = median([sum(o.trajectory["final_f1"] for o in r.outputs) / n for r in runs])
        print(
            f"{name:<18}{n:>4}{median(walls):>8.1f}{spread(walls):>13}{median([r.per_min for r in runs]):>10.1f}"
            f"{gen_rate:>10.1f}{per('prompt_tokens'):>11.0f}{cached / prompt if prompt else 0:>8.0%}"
            f"{per('prefilled_tokens'):>10.0f}{per('tokens_generated'):>9.1f}{per('probe_tokens'):>10.1f}"
            f"{per('retrieval_s'):>8.2f}{engine_s:>9}{f1:>7.3f}"
        )
    print(
        "\n(engine s: seconds from a request's first scheduling to its last token, summed over its requests; "
        "concurrent requests overlap)\n"
    )

    def ratio(a: str, b: str, label: str, target: str, invert: bool = False) -> None:
        if a not in by_name or b not in by_name:
            return
        pairs = [(x.wall_s, y.wall_s) for x, y in zip(by_name[a], by_name[b])]
        values = [(y / x) if not invert else (x / y) for x, y in pairs]
        print(f"{label}: {median(values):.2f}x (repeats {spread(values, '.2f')})   ({target})")

    ratio("probe", "turn-sync", "trajectories/min of the stage over the turn-synchronous baseline", "target >= 1.25x")
    ratio(
        "probe",
        OFFLINE,
        "trajectories/min of the stage over the peers' own design (turn-synchronous on vLLM's offline LLM)",
        "target >= 1.25x",
    )
    modelled = {name: runs for name, runs in by_name.items() if all(r.limits and r.counters for r in runs)}
    for name in LOCKSTEP:
        if name not in by_name:
            continue
        fills = [lockstep_fill(iteration_rows(r)) for r in by_name[name]]
        print(
            f"{name}: decode slots the barrier leaves filled (tokens / longest x trajectories, per turn and phase): "
            f"{median(fills):.0%} (repeats {spread([f * 100 for f in fills], '.0f')} %)"
        )
        if name in modelled:
            concurrency = schedule_of("probe", config)[1]
            gains = [
                modelled_gain(iteration_rows(r), r.limits, LOCKSTEP_SCHEDULE, OVERLAP, concurrency)
                for r in by_name[name]
            ]
            print(
                f"{name}: engine steps under the barrier over those of the stage's schedule (probes beside the next "
                f"turns), modelled on its rows with prefill: {median(gains):.2f}x (repeats {spread(gains, '.2f')})"
            )
    if "probe-first" in modelled:
        runs = by_name["probe-first"]
        concurrency = schedule_of("probe-first", config)[1]
        gains = [modelled_gain(iteration_rows(r), r.limits, PROBE_FIRST, OVERLAP, concurrency) for r in runs]
        print(
            f"probe-first: engine steps with each probe before its next turn over those with the probes beside, "
            f"modelled on its rows with prefill: {median(gains):.2f}x (repeats {spread(gains, '.2f')})"
        )
    for slow in (OFFLINE, "turn-sync", "probe-first", "no-probe"):
        if "probe" in modelled and slow in modelled:
            ratios = counted_ratio(by_name["probe"], by_name[slow], "steps")
            print(f"engine steps counted, {slow} over probe: {median(ratios):.2f}x (repeats {spread(ratios, '.2f')})")
    if modelled:
        print(
            "(a step ratio is the ratio of engine time only where a step costs the same whatever it holds, a GPU "
            "below saturation at the same scheduler limits; searches and the host's own time do not shrink with it. "
            "On a CPU a step costs what it computes: see the ms per step below)"
        )
    if OFFLINE in by_name:
        calls = [f"{len(r.batches)} for {sum(r.batches)} requests (largest {max(r.batches)})" for r in by_name[OFFLINE]]
        print(f"{OFFLINE}: LLM.generate calls per repeat: {'; '.join(calls)}")
    ratio(
        "probe-subset",
        "sequential",
        "trajectories/min of the stage over the sequential baseline (same questions)",
        "target >= 5x",
    )
    ratio("probe", "no-probe", "probing overhead (wall with probing / without)", "target <= 1.10x", invert=True)
    ratio(
        "probe-first",
        "no-probe",
        "probing overhead with each probe before its next turn",
        "for comparison",
        invert=True,
    )
    if "probe" in modelled and "no-probe" in modelled:
        probe, plain = by_name["probe"], by_name["no-probe"]
        computed, steps = counted_ratio(plain, probe, "computed"), counted_ratio(plain, probe, "steps")
        print(
            f"engine work with probing / without, by the engine's counters: tokens computed {median(computed):.2f}x "
            f"(repeats {spread(computed, '.2f')}) in {median(steps):.2f}x the steps (repeats {spread(steps, '.2f')})"
        )
    pairs = [
        ("probe", "no-probe"),
        ("probe", "probe-first"),
        ("probe", "turn-sync"),
        ("probe", OFFLINE),
        ("turn-sync", OFFLINE),
        ("probe-subset", "sequential"),
    ]
    for a, b in pairs:
        if a in by_name and b in by_name:
            counts = [differing(x, y) for x, y in zip(by_name[a], by_name[b])]
            print(
                f"agent transcripts that differ, {a} vs {b}: {', '.join(map(str, counts))} of "
                f"{by_name[a][0].questions} per repeat"
            )
            if show_differences:
                for x, y in zip(by_name[a], by_name[b]):
                    for d in transcript_differences(x, y):
                        where = f"iteration {d.iteration}" if d.iteration is not None else "the transcript (rows agree)"
                        print(
                            f"  repeat {x.repeat}, {d.qid}, first differs at {where}:\n"
                            f"    {a + ':':<19}{d.a!r}\n    {b + ':':<19}{d.b!r}"
                        )
    if len(by_name.get("probe", [])) > 1:
        runs = by_name["probe"]
        counts = [differing(runs[0], r) for r in runs[1:]]
        print(f"agent transcripts that differ between repeats of probe (batch numerics): {', '.join(map(str, counts))}")
    unrecorded = [r for r in results if r.engine.prompt != r.iteration_total("prompt_tokens")]
    print(
        "prompt tokens of the engine's answers = those in the rows: "
        f"{'yes' if not unrecorded else 'no (failed turns have no row)'}"
    )
    for name, runs in by_name.items():
        checks = [counter_problems(r) for r in runs]
        if any(c is None for c in checks):
            print(
                f"rows against the engine's own counters, {name}: not checked ({config.engine.backend} keeps none here)"
            )
            continue
        problems = [p for c in checks for p in c]
        print(
            f"rows against the engine's own counters (prompt, cached, requests equal; generated at most), {name}: "
            f"{'yes' if not problems else 'NO: ' + '; '.join(problems[:3])}"
        )
        print(f"engine steps, {name}: {step_summary(runs)}")
        if name in modelled:
            check = step_check(runs, *schedule_of(name, config))
            print(f"engine steps, model against the engine's count, {name}: {check}")
    for name, runs in by_name.items():
        print(f"CPU, {name}: {cpu_summary(runs)}")
    print(f"quality of {results[0].name}, repeat 0:")
    for key, value in quality(results[0].outputs).items():
        print(f"{key}: {value:.2f}" if "F1" in key or "mean" in key else f"{key}: {value:.0%}")


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


def open_index(config: RunConfig):
    """The config's index (built if missing) in this process, behind the searcher a retrieval replica holds
    (``retrieval.actors.search_threads`` applies)."""
    from raypipe.retrieval import encoder_spec, search_params
    from raypipe.runtime.index_build import ensure_index
    from raypipe.runtime.retrieval import open_replica

    retrieval = config.retrieval
    return open_replica(
        str(ensure_index(config, use_ray=False)),
        encoder_spec(retrieval),
        search_params(retrieval),
        retrieval.actors.search_threads,
    )


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("--limit", type=int, help="questions per dataset (default: the config's data.limit)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every variant, in alternating order")
    parser.add_argument(
        "--sequential-questions",
        type=int,
        default=0,
        help="also run the sequential baseline (and the stage) on this many of the questions (slow)",
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--show-differences",
        action="store_true",
        help="list where each differing agent transcript first differs between variants",
    )
    parser.add_argument("--job", action="store_true", help="also run jobs/probe.py and measure it")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes names from {', '.join(VARIANTS)}")
    setup_logging(args.verbose)
    extra = [f"data.limit={args.limit}", "data.limit_files=true"] if args.limit else []
    config = config_from_args(args, extra)
    questions = load_datasets(config.data.datasets, config.data.limit, config.data.limit_files)

    index = open_index(config)
    plan = [(name, questions) for name in variants]
    if args.sequential_questions:
        subset = evenly_spaced(questions, args.sequential_questions)
        plan += [("probe-subset", subset), ("sequential", subset)]
    plan.sort(key=lambda item: item[0] == OFFLINE)  # last: its engine replaces the async one at most once a repeat
    with MemorySampler() as memory:
        engines = Engines(config)
        results = []
        for repeat in range(args.repeats):
            for name, items in plan if repeat % 2 == 0 else reversed(plan):
                engine = engines.get(OFFLINE_LLM if name == OFFLINE else ASYNC_ENGINE)
                results.append(run_variant(name, repeat, config, items, engine, index))
        engines.close()
    order = {name: i for i, (name, _) in enumerate(plan)}
    results.sort(key=lambda r: (order[r.name], r.repeat))
    print_report(results, config, engines.starts, args.show_differences)
    print(
        f"peak memory of the process tree: {gib(memory.peak_pss)} PSS ({gib(memory.peak_rss)} summed RSS)"
        "   (target < 8 GB)"
    )
    if args.job:
        wall, job_memory, code = run_job(args, [*args.overrides, *extra])
        print(
            f"jobs/probe.py: exit {code}, wall {wall:.1f} s, peak memory {gib(job_memory.peak_pss)} PSS "
            f"({gib(job_memory.peak_rss)} summed RSS)"
        )


if __name__ == "__main__":
    main()

"""The figures of benchmarks/probe.py that docs/benchmarks.md quotes, on hand-computed cases: the decode-slot
fill under a turn barrier, and the rows checked against the engine's own counters (both can fail)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from raypipe.agents import TrajectoryOutput

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    """benchmarks/probe.py, imported by path (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("benchmark_probe", ROOT / "benchmarks" / "probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def rows(*trajectories: list[int | tuple[int, int]]) -> list[dict]:
    """Iteration rows: per trajectory, its turns' generated tokens, or (turn tokens, probe tokens)."""
    out = []
    for turns in trajectories:
        for i, turn in enumerate(turns):
            generated, probe = turn if isinstance(turn, tuple) else (turn, 0)
            out.append({"iteration": i, "tokens_generated": generated, "probe_tokens": probe})
    return out


@pytest.mark.parametrize(
    "trajectories, fill",
    [
        (([100, 10], [100]), 1.0),  # the case: turn 1 has one trajectory (the old code: 0.70)
        (([100], [50]), 150 / 200),
        (([10, 100], [100, 10]), (110 + 110) / (200 + 200)),
        (([(100, 20)], [(100, 10)]), (200 + 30) / (200 + 40)),  # probes are a phase of their own
        (([(40, 5), (0, 5)], [(40, 5), (30, 0)]), 1.0),  # generating nothing holds no slot (else 125 / 155)
        (([30, 30, 30], [30, 90], [60]), (120 + 120 + 30) / (180 + 180 + 30)),
    ],
)
def test_lockstep_fill_on_hand_computed_turns(bench, trajectories, fill):
    assert bench.lockstep_fill(rows(*trajectories)) == pytest.approx(fill, rel=1e-12)


def test_lockstep_fill_without_tokens_is_full(bench):
    assert bench.lockstep_fill([]) == 1.0


def vllm_registry(prompt: float, cached: float, generated: float, requests: dict[str, float],
                  step_tokens: tuple[int, ...] = (), preemptions: float = 0):  # fmt: skip
    """A registry with vLLM's counters and its histogram of tokens per engine step, labelled as vLLM labels them."""
    prometheus = pytest.importorskip("prometheus_client")  # vLLM's dependency
    CollectorRegistry, Counter = prometheus.CollectorRegistry, prometheus.Counter
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    for name, value in (("prompt_tokens", prompt), ("prompt_tokens_cached", cached), ("generation_tokens", generated),
                        ("num_preemptions", preemptions)):  # fmt: skip
        Counter(f"vllm:{name}", name, labels, registry=registry).labels("m", "0").inc(value)
    success = Counter("vllm:request_success", "finished", [*labels, "finished_reason"], registry=registry)
    for reason, count in requests.items():
        success.labels("m", "0", reason).inc(count)
    steps = prometheus.Histogram("vllm:iteration_tokens_total", "tokens per step", labels, registry=registry,
                                 buckets=[1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048])  # fmt: skip
    for tokens in step_tokens:
        steps.labels("m", "0").observe(tokens)
    return registry


def test_engine_counters_read_vllms_totals_or_none(bench):
    registry = vllm_registry(1200, 800, 90, {"stop": 5, "length": 2}, step_tokens=(400, 12, 12, 3), preemptions=1)
    assert bench.engine_counters(registry) == {
        "prompt": 1200, "cached": 800, "generated": 90, "requests": 7, "steps": 4, "preemptions": 1,
    }  # fmt: skip
    assert bench.settled_counters(registry, wait_s=0.01) == bench.engine_counters(registry)
    assert bench.engine_counters(pytest.importorskip("prometheus_client").CollectorRegistry()) is None  # not checked


def result(bench, counters: dict[str, float] | None, requests: int = 3):
    """Two trajectories, 3 requests: rows with 100 + 150 prompt tokens (60 cached), 12 + 8 turn and 5 probe tokens."""
    iterations = [
        {"iteration": 0, "prompt_tokens": 100, "cached_tokens": 40, "tokens_generated": 12, "probe_tokens": 5},
        {"iteration": 0, "prompt_tokens": 150, "cached_tokens": 20, "tokens_generated": 8, "probe_tokens": 0},
    ]
    outputs = [TrajectoryOutput({"qid": "a"}, iterations[:1]), TrajectoryOutput({"qid": "b"}, iterations[1:])]
    engine = bench.SharedEngine(engine=None)
    engine.requests = requests
    return bench.Result("probe", 0, 1.0, outputs, engine, counters)


def test_rows_against_the_engines_counters_can_fail(bench):
    agree = {"prompt": 250, "cached": 60, "generated": 27, "requests": 3}
    assert bench.counter_problems(result(bench, agree)) == []  # 25 generated in the rows, 2 more decoded by the engine
    assert bench.counter_problems(result(bench, None)) is None
    problems = bench.counter_problems(result(bench, {**agree, "prompt": 260, "generated": 20}, requests=4))
    assert problems == [
        "probe (repeat 0): prompt 250 in the rows, 260 by the engine",
        "probe (repeat 0): requests 4 in the rows, 3 by the engine",
        "probe (repeat 0): generated 25 in the rows, more than the engine's 20",
    ]


def test_step_summary_is_the_cost_models_terms(bench):
    counters = {"prompt": 250, "cached": 60, "generated": 27, "requests": 3, "steps": 10, "preemptions": 2}
    one, other = result(bench, counters), result(bench, {**counters, "steps": 20, "preemptions": 0})
    other.wall_s = 3.0
    # (250 - 60 + 27) tokens computed: 21.7 and 10.85 a step; 1 s / 10 steps and 3 s / 20 steps
    assert bench.step_summary([one, other]) == (
        "15 per run (10-20), 16.3 tokens computed per step, 125.0 ms of wall per step, 1 preemptions"
    )


def test_tree_cpu_seconds_counts_the_processes_under_this_one(bench):
    before = bench.tree_cpu_seconds()
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        process, deadline = psutil.Process(child.pid), time.monotonic() + 20
        while sum(process.cpu_times()[:2]) < 0.5:  # user + system: the burn is done, the child sleeps
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert bench.tree_cpu_seconds() - before >= 0.5  # the living child's CPU time is the tree's
    finally:
        child.kill()
        child.wait()


def test_cpu_summary_is_median_and_range_over_the_runs(bench):
    runs = [result(bench, None), result(bench, None), result(bench, None)]
    for run, cpu, steal in zip(runs, (100.0, 130.0, 110.0), (0.0, 4.0, 1.5)):
        run.cpu_s, run.steal_s = cpu, steal
    assert bench.cpu_summary(runs) == "110.0 CPU s of the process tree (100.0-130.0), 1.5 s stolen from the machine (0.0-4.0)"

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


def vllm_registry(
    prompt: float,
    cached: float,
    generated: float,
    requests: dict[str, float],
    step_tokens: tuple[int, ...] = (),
    preemptions: float = 0,
):
    """A registry with vLLM's counters and its histogram of tokens per engine step, labelled as vLLM labels them."""
    prometheus = pytest.importorskip("prometheus_client")  # vLLM's dependency
    CollectorRegistry, Counter = prometheus.CollectorRegistry, prometheus.Counter
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    for name, value in (
        ("prompt_tokens", prompt),
        ("prompt_tokens_cached", cached),
        ("generation_tokens", generated),
        ("num_preemptions", preemptions),
    ):
        Counter(f"vllm:{name}", name, labels, registry=registry).labels("m", "0").inc(value)
    success = Counter("vllm:request_success", "finished", [*labels, "finished_reason"], registry=registry)
    for reason, count in requests.items():
        success.labels("m", "0", reason).inc(count)
    steps = prometheus.Histogram(
        "vllm:iteration_tokens_total",
        "tokens per step",
        labels,
        registry=registry,
        buckets=[1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048],
    )
    for tokens in step_tokens:
        steps.labels("m", "0").observe(tokens)
    return registry


def test_engine_counters_read_vllms_totals_or_none(bench):
    registry = vllm_registry(1200, 800, 90, {"stop": 5, "length": 2}, step_tokens=(400, 12, 12, 3), preemptions=1)
    assert bench.engine_counters(registry) == {
        "prompt": 1200,
        "cached": 800,
        "generated": 90,
        "requests": 7,
        "steps": 4,
        "preemptions": 1,
    }
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
    assert (
        bench.cpu_summary(runs)
        == "110.0 CPU s of the process tree (100.0-130.0), 1.5 s stolen from the machine (0.0-4.0)"
    )


def step_rows(*trajectories: list[tuple[int, int, int, int]]) -> list[dict]:
    """Iteration rows: per trajectory, per turn (turn prefill, turn tokens, probe prefill, probe tokens); a turn
    prefill of 0 is a forced answer's row (its probe only). Nothing cached: every prompt token is prefilled."""
    out = []
    for t, turns in enumerate(trajectories):
        for i, (turn_prefill, generated, probe_prefill, probe) in enumerate(turns):
            out.append(
                {
                    "qid": f"t{t}",
                    "iteration": i,
                    "tokens_generated": generated,
                    "probe_tokens": probe,
                    "prompt_tokens": turn_prefill + probe_prefill,
                    "cached_tokens": 0,
                    "probe_prompt_tokens": probe_prefill,
                    "probe_cached_tokens": 0,
                }
            )
    return out


@pytest.fixture
def wide(bench):
    return bench.Limits(tokens=10_000, seqs=256)


def test_one_request_takes_its_generated_tokens_in_steps(bench, wide):
    # the step that ends the prompt samples the first token: 1 + 4 decode steps
    assert bench.modelled_steps(step_rows([(10, 5, 0, 0)]), bench.OVERLAP, wide) == 5
    # a prompt longer than a step's tokens is prefilled in chunks: 8 + 8 + 4 (and the first token), then 2 more
    assert bench.modelled_steps(step_rows([(20, 3, 0, 0)]), bench.OVERLAP, bench.Limits(8, 256)) == 5


@pytest.mark.parametrize("lag", [0, 1])
def test_probes_beside_the_next_turn_leave_the_path(bench, wide, lag):
    one = step_rows([(1, 10, 1, 2), (1, 10, 1, 2)])
    # turns 10 + 10 steps, the first probe beside the second turn, the last probe after it: 22 (the gaps a lag
    # leaves between requests are no engine steps); one after another: 10 + 2 + 10 + 2
    assert bench.modelled_steps(one, bench.OVERLAP, wide, lag=lag) == 22
    assert bench.modelled_steps(one, bench.PROBE_FIRST, wide, lag=lag) == 24
    assert bench.modelled_steps(one, bench.LOCKSTEP_SCHEDULE, wide, lag=lag) == 24


def test_the_barrier_makes_every_phase_its_longest_request(bench, wide):
    rows = step_rows([(1, 10, 1, 1), (1, 1, 1, 1)], [(1, 1, 1, 1), (1, 10, 1, 1)])
    # lock-step: phases of 10, 1, 10, 1 steps; without it both trajectories end by step 12 (0-11)
    assert bench.modelled_steps(rows, bench.LOCKSTEP_SCHEDULE, wide, lag=0) == 22
    assert bench.modelled_steps(rows, bench.OVERLAP, wide, lag=0) == 12
    assert bench.modelled_gain(rows, wide, bench.LOCKSTEP_SCHEDULE, bench.OVERLAP) == pytest.approx(
        bench.modelled_steps(rows, bench.LOCKSTEP_SCHEDULE, wide) / bench.modelled_steps(rows, bench.OVERLAP, wide)
    )


def test_prefill_takes_steps_of_its_own_when_prompts_crowd_a_step(bench):
    rows = step_rows([(3, 2, 0, 0)], [(3, 2, 0, 0)], [(3, 2, 0, 0)])
    # 4 tokens and 2 sequences a step: step 0 prefills 3 + 1, step 1 decodes one and ends the other's prompt,
    # step 2 decodes it and admits the third (3), step 3 decodes the third: 4 steps, not the 2 of the decode count
    assert bench.modelled_steps(rows, bench.OVERLAP, bench.Limits(4, 2)) == 4
    assert bench.modelled_steps(rows, bench.OVERLAP, bench.Limits(4, 2, chunked=False)) == 4
    assert bench.modelled_steps(rows, bench.OVERLAP, bench.Limits(1000, 256)) == 2
    # one trajectory in flight at a time: 2 steps each
    assert bench.modelled_steps(rows, bench.OVERLAP, bench.Limits(1000, 256), concurrency=1) == 6


def test_a_forced_answer_waits_for_every_probe(bench, wide):
    # turn 0 (5 steps), its probe of 8 beside turn 1 (2 steps); the forced answer (a probe-only row) waits for
    # the first probe: 5 + 8 + 3 = 16, not 5 + 2 + 3
    rows = step_rows([(1, 5, 1, 8), (1, 2, 0, 0), (0, 0, 1, 3)])
    assert bench.modelled_steps(rows, bench.OVERLAP, wide, lag=0) == 16


def test_cached_prompt_tokens_are_not_prefilled(bench):
    rows = step_rows([(20, 2, 0, 0)])
    rows[0]["cached_tokens"] = 16  # 4 left to compute: one step at 8 tokens a step
    assert bench.modelled_steps(rows, bench.OVERLAP, bench.Limits(8, 256)) == 2


def step_result(bench, steps: float, name: str = "probe"):
    """A run of one trajectory: one turn of 12 tokens after a 10-token prompt (12 modelled steps), and the engine's
    counters with ``steps`` steps."""
    outputs = [TrajectoryOutput({"qid": "t0"}, step_rows([(10, 12, 0, 0)]))]
    counters = {"prompt": 10, "cached": 0, "generated": 12, "requests": 1, "steps": steps}
    return bench.Result(
        name, 0, 1.0, outputs, bench.SharedEngine(engine=None), counters, limits=bench.Limits(10_000, 256)
    )


def test_step_check_flags_a_model_off_the_engines_count(bench):
    assert bench.step_check([step_result(bench, 12), step_result(bench, 13)], bench.OVERLAP, None) == (
        "12/12, 12/13 modelled/counted per run, off by at most 7.7%: ok (tolerance 10%)"
    )
    assert bench.step_check([step_result(bench, 12), step_result(bench, 20)], bench.OVERLAP, None).endswith(
        "off by at most 40.0%: MISMATCH (tolerance 10%)"
    )


def test_counted_ratio_is_the_engines_own_work(bench):
    plain = [step_result(bench, 100), step_result(bench, 100)]
    probing = [step_result(bench, 104), step_result(bench, 110)]
    probing[1].counters = {**probing[1].counters, "generated": 12 + 22}  # 44 tokens computed against 22
    assert bench.counted_ratio(plain, probing, "steps") == pytest.approx([1.04, 1.10])
    assert bench.counted_ratio(plain, probing, "computed") == pytest.approx([1.0, 2.0])


def test_scheduler_limits_read_vllms_own_config(bench):
    from types import SimpleNamespace

    from vllm.config import SchedulerConfig

    scheduler = SchedulerConfig(
        max_model_len=2048,
        is_encoder_decoder=False,
        max_num_batched_tokens=4096,
        max_num_seqs=64,
        enable_chunked_prefill=False,
    )
    vllm = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=scheduler))
    assert bench.scheduler_limits(SimpleNamespace(_llm=vllm)) == bench.Limits(4096, 64, chunked=False)  # async engine
    assert bench.scheduler_limits(SimpleNamespace(llm=SimpleNamespace(llm_engine=vllm))) == bench.Limits(
        4096, 64, False
    )
    assert bench.scheduler_limits(SimpleNamespace()) is None  # another engine (the fake)

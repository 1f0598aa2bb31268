"""benchmarks/serve_agent.py's computations on hand-made timelines: the steady-state window, the throughput over
it, the rule that says when a percentile is shown, the seeded open-loop schedule, and the closed and open loops
(against a fake sender: what is tested is how the loops send)."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.benchmarks import imported_benchmark


@pytest.fixture(scope="module")
def bench():
    """benchmarks/serve_agent.py, imported by path (benchmarks/ is no package; it imports first_run beside it)."""
    with imported_benchmark("serve_agent") as module:
        yield module


def timeline(bench, *spans: tuple[float, float] | tuple[float, float, int]):
    return [bench.Request(s[0], s[1], s[2] if len(s) > 2 else 200, {}) for s in spans]


def test_one_closed_client_runs_at_one_over_its_latency(bench):
    # one client, 10 s a request: sent at 0, 10, 20, 30, 40
    requests = timeline(bench, (0, 10), (10, 20), (20, 30), (30, 40), (40, 50))
    window = bench.steady_window(requests, warmup=0.2)  # the first completion (10) ends the warm-up
    assert window == (10, 40)  # to the last request sent; the last answer (50) is drain
    assert bench.throughput(requests, window) == pytest.approx(3 / 30 * 60)  # 20, 30, 40 in (10, 40]: 6/min


def test_warmup_and_drain_are_left_out(bench):
    # open loop past capacity: a request every second, the replica answers one every 2 s after a slow first one
    requests = timeline(bench, *[(i, 10 + 2 * i) for i in range(10)])
    assert bench.steady_window(requests, warmup=0.0) == (0, 9)  # from the first request sent
    assert bench.throughput(requests, (0, 9)) is not None and bench.throughput(requests, (0, 9)) == 0  # all drain
    # a longer run: 40 arrivals a second apart, answers at 10, 12, ..., the first 4 (warm-up) ending at 16
    requests = timeline(bench, *[(i, 10 + 2 * i) for i in range(40)])
    window = bench.steady_window(requests, warmup=0.1)
    assert window == (16, 39)
    assert bench.throughput(requests, window) == pytest.approx(11 / 23 * 60)  # 18, 20, ..., 38: the replica's 30/min
    # refused requests end the warm-up as they come back, and are not answers
    refused = timeline(bench, (0, 1, 429), (1, 2, 503), (2, 5), (3, 6))
    assert bench.steady_window(refused, warmup=0.5) == (2, 3)
    assert bench.throughput(refused, (0, 6)) == pytest.approx(2 / 6 * 60)


def test_no_window_without_time_after_the_warmup(bench):
    assert bench.steady_window([], warmup=0.1) is None
    requests = timeline(bench, (0, 5), (0, 6), (0, 7))  # every request sent at once: no steady state
    assert bench.steady_window(requests, warmup=0.0) is None
    assert bench.throughput(requests, None) is None


@pytest.mark.parametrize("q, needs", [(50, 2), (95, 20), (99, 100), (90, 10)])
def test_a_percentile_needs_one_sample_at_or_above_it(bench, q, needs):
    assert not bench.supported(q, needs - 1) and bench.supported(q, needs)
    assert bench.percentile([float(i) for i in range(1, needs)], q) is None
    assert bench.percentile([float(i) for i in range(1, needs + 1)], q) is not None


def test_percentile_values_by_hand(bench):
    values = [float(i) for i in range(1, 21)]  # 1..20
    assert bench.percentile(values, 95) == pytest.approx(1 + 0.95 * 19)  # 19.05
    assert bench.percentile(values[::-1], 50) == pytest.approx(10.5)
    assert bench.percentile([3.0, 1.0], 50) == pytest.approx(2.0)


def test_median_range_marks_repeats_without_the_percentile(bench):
    assert bench.median_range([2.0, 1.0, 4.0], ".1f") == "2.0 (1.0-4.0)"
    assert bench.median_range([2.0, None, 4.0], ".1f") == "3.0 (2.0-4.0) [2/3]"
    assert bench.median_range([None, None], ".1f") == "-"


def test_open_loop_schedule_is_seeded_poisson(bench):
    a, b = bench.arrivals(30, 2000, seed=7), bench.arrivals(30, 2000, seed=7)
    assert a == b and a != bench.arrivals(30, 2000, seed=8)
    assert all(x < y for x, y in zip(a, a[1:]))
    assert a[-1] / len(a) == pytest.approx(2.0, rel=0.05)  # 30 per minute: one every 2 s on average
    assert bench.open_loop_rates(12.0, [0.5, 1, 1.5]) == [6.0, 12.0, 18.0]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_closed_loop_keeps_exactly_its_clients_in_flight(bench):
    clock, in_flight, most = FakeClock(), [0], [0]

    async def send(question):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.001)
        clock.now += 1.0
        in_flight[0] -= 1
        return 200, {"q": question}

    requests = asyncio.run(bench.closed_loop(send, list(range(10)), clients=4, clock=clock))
    assert len(requests) == 10 and most[0] == 4
    assert sorted(r.answer["q"] for r in requests) == list(range(10))


def test_open_loop_sends_at_the_arrival_times(bench):
    sent = []

    async def send(question):
        sent.append(question)
        await asyncio.sleep(0.2)  # slower than the arrivals: they queue in flight, none waits for another
        return 503, None

    times = [0.0, 0.01, 0.02]
    requests = asyncio.run(bench.open_loop(send, ["a", "b", "c"], times))
    assert sent == ["a", "b", "c"] and [r.status for r in requests] == [503, 503, 503]
    assert max(r.sent for r in requests) < 0.15  # all sent before the first came back


def test_the_table_shows_a_percentile_only_where_supported(bench, capsys):
    answer = {"iterations": 2, "cost": {"generated_tokens": 100, "prefilled_tokens": 50}, "f1": 0.5}

    def run(policy: str, n: int, repeat: int):
        return bench.Run(
            "closed", 1, policy, repeat, [bench.Request(10.0 * i, 10.0 * i + 10, 200, answer) for i in range(n)]
        )

    bench.print_table([run("natural", 20, 0), run("natural", 19, 1), run("cap1", 5, 0)], warmup=0.1)
    rows = {line.split()[3]: line for line in capsys.readouterr().out.splitlines() if line.startswith("closed")}
    # natural: p95 from the 20-answer repeat only ([1/2]); cap1: 5 answers, no p95; nobody has 100 for p99
    assert "[1/2]" in rows["natural"] and rows["natural"].count(" - ") == 1
    assert rows["cap1"].count(" - ") == 2
    assert "6.00" in rows["natural"]  # one answer every 10 s in the window: 6 per minute


def test_the_questions_sent_come_from_the_configured_split_round_robin(bench):
    from raypipe.core.config import load_config
    from raypipe.data.split import bundled_split

    config = load_config(overrides=["data.split=dev"])
    sent = bench.questions_round_robin(config, 9)
    dev = {q.qid for q in bundled_split(config.agent_train.dev_percent, config.data.datasets).dev}
    assert len(sent) == 9 and {q.qid for q in sent} <= dev  # none a tuned agent or a bundle was trained on
    assert [q.dataset for q in sent[:3]] == list(config.data.datasets)  # one of each dataset in turn

"""benchmarks/decision_parts.py's computations on hand-made cases: the rounds in which the controller meets a run's
decisions, the per-decision split of the timed parts, and the timing wrappers."""

from __future__ import annotations

import time

import pytest

from tests.helpers.benchmarks import imported_benchmark


@pytest.fixture(scope="module")
def bench():
    with imported_benchmark("decision_parts") as module:
        yield module


def rows(qid: str, last: int) -> list[dict]:
    return [{"qid": qid, "iteration": i} for i in range(last, -1, -1)]  # any order, iteration 0 included


def test_round_i_holds_every_trajectory_that_reached_iteration_i_with_its_history_up_to_i(bench):
    rounds = bench.decision_rounds(
        {"a": rows("a", 1), "b": rows("b", 3), "c": rows("c", 2)}, {"a": "A?", "b": "B?", "c": "C?"}
    )
    assert [[(question, [r["iteration"] for r in history]) for history, question in r] for r in rounds] == [
        [("A?", [0, 1]), ("B?", [0, 1]), ("C?", [0, 1])],
        [("B?", [0, 1, 2]), ("C?", [0, 1, 2])],
        [("B?", [0, 1, 2, 3])],
    ]


def test_a_trajectory_that_never_searched_has_no_decision(bench):
    assert bench.decision_rounds({"a": rows("a", 0)}, {"a": "A?"}) == []


def test_per_decision_splits_the_decision_into_its_parts_and_the_rest(bench):
    seconds = {"decision": 2.0, "features": 0.5, "sup_p_ii": 1.0, "heads": 0.1}
    ms = bench.per_decision_ms(seconds, decisions=4)
    assert ms == pytest.approx({"features": 125.0, "sup_p_ii": 250.0, "heads": 25.0, "rest": 100.0})
    assert sum(ms.values()) == pytest.approx(2.0 * 1000 / 4)  # the parts and the rest make the decision


def test_timed_sums_each_parts_calls_and_passes_everything_else_through(bench):
    class Scorer:
        batch_size = 8

        def score(self, texts, max_tokens):
            time.sleep(0.01)
            return [len(t) for t in texts]

    watch = bench.Stopwatch()
    scorer = bench.Timed(Scorer(), "score", "sup_p_ii", watch)
    assert scorer.score(["ab", "c"], 16) == [2, 1] and scorer.score([], 16) == []
    assert scorer.batch_size == 8
    assert 0.02 <= watch.seconds["sup_p_ii"] < 1.0


def test_a_cell_is_the_median_with_its_range(bench):
    assert bench.spread([3.0, 1.0, 2.0], ".1f") == "2.0 [1.0-3.0]"

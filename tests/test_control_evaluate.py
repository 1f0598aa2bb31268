"""Offline evaluation: cost accounting, caps, summaries, loading from run tables, the split."""

import math

import pytest

from raypipe.core.schema import conform
from raypipe.stopping.caps import cap, natural
from raypipe.stopping.replay import (
    Decision,
    Trajectory,
    evaluate,
    outcome,
    replay,
    split_qids,
    summarise,
    trajectories_from_tables,
)

# P_0..P_3, tokens per iteration (agent + probe), natural answer F1 0.5, 100 tokens in all
T = Trajectory("q1", "hotpotqa", (0.0, 0.2, 0.8, 0.5), (10, 20, 30, 40), 0.5, 100)
SHORT = Trajectory("q2", "musique", (0.3, 0.6), (10, 10), 0.6, 20)


def test_trajectory_validation():
    assert T.n_iterations == 3
    with pytest.raises(ValueError, match="token counts"):
        Trajectory("x", "d", (0.1, 0.2), (1,), 0.2, 1)
    with pytest.raises(ValueError, match="no iterations"):
        Trajectory("x", "d", (), (), 0.2, 1)


def test_cost_is_counted_up_to_the_decision_iteration():
    stop = outcome(T, Decision(decision_iteration=2, answer_iteration=2))
    assert (stop.iterations, stop.tokens, stop.f1) == (2, 60, 0.8)
    # rollback: the answer of iteration 1, the cost of iterations 0..2
    rollback = outcome(T, Decision(decision_iteration=2, answer_iteration=1))
    assert (rollback.iterations, rollback.tokens, rollback.f1) == (2, 60, 0.2)
    # deciding at the last iteration costs what the recorded trajectory cost
    last = outcome(T, Decision(decision_iteration=3, answer_iteration=1))
    assert (last.iterations, last.tokens, last.f1) == (3, 100, 0.2)
    nat = outcome(T, natural(T))
    assert (nat.iterations, nat.tokens, nat.f1) == (3, 100, 0.5)
    assert (nat.natural_iterations, nat.natural_tokens, nat.natural_f1) == (3, 100, 0.5)
    zero = outcome(T, Decision(decision_iteration=0, answer_iteration=0))
    assert (zero.iterations, zero.tokens, zero.f1) == (0, 10, 0.0)


def test_bad_decisions_are_rejected():
    with pytest.raises(ValueError, match="answer iteration 3 outside 0..2"):
        outcome(T, Decision(decision_iteration=2, answer_iteration=3))
    with pytest.raises(ValueError, match="< 0"):
        outcome(T, Decision(decision_iteration=-1))


@pytest.mark.parametrize(
    "k,iters,f1,tokens",
    [(0, 0, 0.0, 10), (1, 1, 0.2, 30), (2, 2, 0.8, 60), (3, 3, 0.5, 100), (5, 3, 0.5, 100)],
)
def test_cap(k, iters, f1, tokens):
    o = outcome(T, cap(k)(T))
    assert (o.iterations, o.f1, o.tokens) == (iters, f1, tokens)
    assert (o.answer_iteration is None) == (k >= 3)


def test_cap_rejects_negative():
    with pytest.raises(ValueError):
        cap(-1)


def test_summary_against_natural():
    s = evaluate("cap1", [T, SHORT], cap(1))
    # T: 1 iteration, F1 0.2, 30 tokens; SHORT ends by itself at 1: 1, 0.6, 20
    assert s.questions == 2
    assert s.mean_iterations == pytest.approx(1.0)
    assert s.natural_iterations == pytest.approx(2.0)
    assert s.iterations_change == pytest.approx(-0.5)
    assert s.mean_f1 == pytest.approx(0.4)
    assert s.f1_share == pytest.approx(0.4 / 0.55)
    assert s.tokens_saved == pytest.approx(1 - 25 / 60)
    row = s.row()
    assert row["controller"] == "cap1" and row["f1_share"] == pytest.approx(s.f1_share)
    nat = summarise("natural", replay([T, SHORT], natural))
    assert (nat.iterations_change, nat.f1_share, nat.tokens_saved) == (0.0, 1.0, 0.0)


def test_summary_edge_cases():
    with pytest.raises(ValueError, match="no outcomes"):
        summarise("x", [])
    zero = Trajectory("z", "d", (0.0,), (3,), 0.0, 3)
    s = evaluate("natural", [zero], natural)
    assert math.isnan(s.f1_share) and s.iterations_change == 0.0


def test_split_is_deterministic_disjoint_and_near_the_fraction():
    qids = [f"q{i}" for i in range(1000)]
    val, test = split_qids(qids, 0.5, seed=0)
    assert val.isdisjoint(test) and val | test == set(qids)
    assert 430 < len(val) < 570
    assert split_qids(reversed(qids), 0.5, seed=0) == (val, test)
    assert split_qids(qids, 0.5, seed=1) != (val, test)
    with pytest.raises(ValueError):
        split_qids(qids, 1.0)


def _iteration_row(qid, i, f1, tokens=7, probe=3):
    return {
        "qid": qid,
        "dataset": "hotpotqa",
        "iteration": i,
        "query": None if i == 0 else "q",
        "doc_ids": [],
        "doc_scores": [],
        "reasoning": "",
        "probe_answer": "a",
        "probe_token_logprobs": [],
        "probe_f1": f1,
        "utility": None,
        "tokens_generated": tokens,
        "probe_tokens": probe,
    }


def _trajectory_row(qid, n, final_f1, tokens, probes, stop="answer"):
    return {
        "qid": qid,
        "dataset": "hotpotqa",
        "question": "?",
        "golden_answers": ["a"],
        "final_answer": "a",
        "final_f1": final_f1,
        "n_iterations": n,
        "stop_reason": stop,
        "error": None,
        "tokens_generated": tokens,
        "probe_tokens": probes,
        "wall_s": 1.0,
        "transcript": "",
    }


def test_trajectories_from_tables():
    its = conform(
        [
            _iteration_row("a", 0, 0.0),
            _iteration_row("a", 1, None),
            _iteration_row("a", 2, 0.5),
            _iteration_row("b", 0, 1.0),
            _iteration_row("e", 0, 0.0),
            _iteration_row("c", 0, 0.0),
        ],
        "iterations",
    )
    trs = conform(
        [
            _trajectory_row("a", 2, 0.5, 21, 9),
            _trajectory_row("b", 0, 1.0, 7, 3),
            _trajectory_row("e", 0, None, 0, 0, stop="engine_error"),
            _trajectory_row("m", 0, None, 0, 0, stop="answer"),
            _trajectory_row("c", 0, 0.0, 7, 3, stop="controller"),
        ],
        "trajectories",
    )
    records, excluded = trajectories_from_tables(its, trs)
    assert excluded == {"engine_error": 1, "no_iterations": 1, "controller": 1}
    a, b = records
    assert a.probe_f1 == (0.0, 0.0, 0.5)  # a missing probe F1 counts as 0
    assert a.iteration_tokens == (10, 10, 10) and a.total_tokens == 30
    assert (a.final_f1, a.n_iterations) == (0.5, 2)
    assert b.n_iterations == 0


def test_trajectories_from_tables_rejects_gaps():
    its = conform([_iteration_row("a", 0, 0.0), _iteration_row("a", 2, 0.5)], "iterations")
    trs = conform([_trajectory_row("a", 2, 0.5, 14, 6)], "trajectories")
    with pytest.raises(ValueError, match="not 0..2"):
        trajectories_from_tables(its, trs)


def test_exact_match_is_scored_from_the_recorded_answers_under_the_runs_rule():
    rows = [
        {**_iteration_row("a", i, f), "probe_answer": ans}
        for i, (f, ans) in enumerate([(0.0, None), (0.5, "The Paris"), (1.0, "paris_france")])
    ]
    trs = [{**_trajectory_row("a", 2, 1.0, 21, 9), "golden_answers": ["Paris France", "Paris"], "final_answer": "yes"}]
    its, trs = conform(rows, "iterations"), conform(trs, "trajectories")
    (hotpot,), _ = trajectories_from_tables(its, trs)
    (r1,), _ = trajectories_from_tables(its, trs, "r1searcher")
    assert hotpot.probe_em == (0.0, 1.0, 0.0) and hotpot.final_em == 0.0  # "The Paris" drops its article
    assert r1.probe_em == (0.0, 1.0, 1.0)  # R1-Searcher's rule turns the underscore into a space
    rollback = outcome(hotpot, Decision(decision_iteration=2, answer_iteration=1))
    assert (rollback.f1, rollback.em, rollback.natural_em) == (0.5, 1.0, 0.0)  # the returned answer's own EM
    assert outcome(hotpot, Decision(2)).em == 0.0


def test_a_run_directory_scores_exact_match_under_its_recorded_metric(tmp_path):
    import yaml

    from raypipe.core.config import ConfigError
    from raypipe.core.rundir import RunDir

    run = RunDir(tmp_path)
    assert run.metric_rule() == "hotpotqa"  # no config.yaml: the default rule
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"agent": {"metric": "r1searcher"}}))
    assert run.metric_rule() == "r1searcher"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"agent": {"metric": "bleu"}}))
    with pytest.raises(ConfigError, match="agent.metric 'bleu'"):
        run.metric_rule()

"""Stop-RAG cores: targets pinned on hand-computed trajectories, the schedule, the decision rule, states."""

import math

import pytest

from raypipe.stopping.replay import Trajectory, evaluate
from raypipe.stoprag.targets import (
    Episode,
    Round,
    Sample,
    binary_label,
    build_episode,
    candidate_thresholds,
    cont_target,
    cosine_lambda,
    first_stop,
    margin_controller,
    mc_target,
    nstep_returns,
    q0_target,
    qlambda_target,
    rounds_from_history,
    selected_documents,
    state_text,
    training_samples,
    tune_threshold,
    with_documents,
)

# s_0..s_3, s_3 terminal. From s_0: r_1..r_3 = 0.5, 0.0, 1.0; bootstraps max(Q_stop, Q_cont) at s_1, s_2.
FUTURE = (0.5, 0.0, 1.0)
BOOT = (0.6, 0.3)


def test_nstep_returns_by_hand():
    # G_1 = boot(s_1) = 0.6; G_2 = max(r_1, boot(s_2)) = max(0.5, 0.3) = 0.5
    assert nstep_returns(FUTURE, BOOT) == [0.6, 0.5]


def test_qlambda_one_is_monte_carlo():
    assert qlambda_target(FUTURE, BOOT, 1.0) == mc_target(FUTURE) == 1.0


def test_qlambda_zero_is_one_step_q0():
    assert qlambda_target(FUTURE, BOOT, 0.0) == q0_target(FUTURE, BOOT) == 0.6


def test_qlambda_mixed_by_hand():
    # (1-.5) * (0.6 + .5 * 0.5) + .5^2 * 1.0 = 0.425 + 0.25
    assert qlambda_target(FUTURE, BOOT, 0.5) == pytest.approx(0.675)


def test_qlambda_weights_sum_to_one():
    assert qlambda_target((0.4, 0.4, 0.4), (0.4, 0.4), 0.3) == pytest.approx(0.4)


def test_next_state_terminal_needs_no_bootstrap():
    for lam in (0.0, 0.37, 1.0):
        assert qlambda_target((0.8,), (), lam) == 0.8


def test_bootstrap_count_checked():
    with pytest.raises(ValueError, match="bootstrap"):
        nstep_returns(FUTURE, (0.1,))
    with pytest.raises(ValueError, match="lambda"):
        qlambda_target(FUTURE, BOOT, 1.5)


def test_binary_label_ties_count_as_stop():
    assert binary_label(1.0, FUTURE) == 1.0
    assert binary_label(0.99, FUTURE) == 0.0


def test_cont_target_dispatch():
    sample = Sample(state=0, reward=0.2, future_rewards=FUTURE, future_states=(1, 2))
    assert cont_target("mc", sample, BOOT, 0.5) == 1.0
    assert cont_target("q0", sample, BOOT, 0.5) == 0.6
    assert cont_target("qlambda", sample, BOOT, 0.5) == pytest.approx(0.675)
    assert cont_target("binary", sample, BOOT, 0.5) == 0.0
    with pytest.raises(ValueError, match="unknown target"):
        cont_target("td9", sample, BOOT, 0.5)


def test_cosine_schedule():
    assert cosine_lambda(0, 100) == 1.0
    assert cosine_lambda(50, 100) == pytest.approx(0.55)
    assert cosine_lambda(100, 100) == pytest.approx(0.1)
    assert cosine_lambda(500, 100) == pytest.approx(0.1)  # clamped after the end
    assert cosine_lambda(25, 100) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    values = [cosine_lambda(s, 10) for s in range(11)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(
    "margins,threshold,expected",
    [
        ([0.1, 0.5, 0.9], 0.3, 1),  # first crossing, not the largest margin
        ([0.3, 0.2, 0.9], 0.3, 2),  # equal to the threshold does not stop; terminal reached
        ([0.31, 0.9, 0.0], 0.3, 0),
        ([-1.0, -0.5, -2.0], -0.6, 1),  # negative thresholds work
        ([5.0], 0.0, 0),  # a single (terminal) state
        ([0.0, 0.0, 99.0], 0.5, 2),  # the terminal state's margin is never consulted
    ],
)
def test_first_stop(margins, threshold, expected):
    assert first_stop(margins, threshold) == expected


def _trajectory(qid, f1s, final=None):
    return Trajectory(qid, "d", tuple(f1s), (1,) * len(f1s), f1s[-1] if final is None else final, len(f1s))


def test_margin_controller_first_crossing():
    traj = _trajectory("a", [0.0, 1.0, 0.5, 0.0])
    margins = {"a": {1: 0.1, 2: 0.5, 3: 9.0}}  # the terminal iteration's margin is never consulted
    decide = margin_controller(margins, 0.3)
    d = decide(traj)
    assert (d.decision_iteration, d.answer_iteration) == (2, 2)
    d = margin_controller(margins, 0.5)(traj)  # equal to the threshold does not stop
    assert d.answer_iteration is None and d.decision_iteration == 3
    with pytest.raises(ValueError, match="no stoprag margins"):
        decide(_trajectory("zz", [0.0, 1.0]))


def test_tuning_on_validation():
    trajs = [_trajectory("a", [0.0, 1.0, 1.0, 0.0]), _trajectory("b", [0.0, 0.0, 1.0])]
    margins = {"a": {1: 0.4, 2: 0.4}, "b": {1: -0.2}}
    assert candidate_thresholds(margins) == [-1.2, 0.1, 0.4]
    thr, summary = tune_threshold(trajs, margins)
    assert -0.2 <= thr < 0.4 and summary.mean_f1 == 1.0 and summary.mean_iterations == 1.5
    assert evaluate("stoprag", trajs, margin_controller(margins, thr)) == summary
    # "share": fewest iterations keeping 50% of natural F1 (natural 0.5): stopping both at once gives 0.5
    thr, summary = tune_threshold(trajs, margins, objective="share", min_share=0.5)
    assert thr < -0.2 and summary.mean_iterations == 1.0


def test_state_text_docs_is_the_reference_input():
    """Training/utils.py l.15-24 (``convert_chat_to_text``, docs only) over multihead_stop_decider_train.py
    l.53-55: ``question[SEP]title: text[SEP]...`` joined without spaces, one document per iteration chosen
    as pipeline_sep.py l.77-87 chooses it (the best-ranked not yet selected), full text."""
    rounds = [
        Round("q1", (("d1", "T1", "one  text"), ("d2", "T2", "two")), "think1", "a1"),
        Round("q2", (("d1", "T1", "one  text"), ("d3", "T3", "x" * 50)), "think2", "a2"),
    ]
    assert state_text("Who? ", rounds) == "Who?[SEP]T1: one text[SEP]T3: " + "x" * 50
    assert state_text("Who?", rounds, sep="</s>") == "Who?</s>T1: one text</s>T3: " + "x" * 50
    assert state_text("Who?", rounds, doc_chars=3) == "Who?[SEP]T1: one[SEP]T3: xxx"  # the cut is an option
    assert (
        state_text("Who?", rounds, per_round=None)
        == "Who?[SEP]T1: one text[SEP]T2: two[SEP]T3: " + "x" * 50 + "[SEP]T1: one text"
    )


def test_state_text_trace_is_the_reference_full_trace():
    """Training/utils.py l.25-37 (full trace): the question, then each Follow up / Document / Intermediate
    answer line as its own part."""
    rounds = [Round("q1", (("d1", "T1", "one"),), "think", "a1"), Round(" q2 ", (("d2", "T2", "two"),), "", "a2")]
    assert state_text("Who?", rounds, "trace") == (
        "Who?[SEP]Follow up: q1[SEP]Document: T1: one[SEP]Intermediate answer: a1"
        "[SEP]Follow up: q2[SEP]Document: T2: two[SEP]Intermediate answer: a2"
    )


def test_selected_documents_one_new_per_round():
    """pipeline_sep.py l.77-87: seen documents score -inf, so the best new one is selected; a round whose
    documents were all seen repeats its top one (as the reference's trace does, l.83-94), and a round that
    retrieved nothing adds an empty part: every state differs from the one before."""
    a, b, c = ("a", "A", "x"), ("b", "B", "y"), ("c", "C", "z")
    rounds = [Round("q", (a, b)), Round("q", (a, b, c)), Round("q", (b, a)), Round("q", ())]
    assert selected_documents(rounds) == [(a,), (b,), (b,), ()]
    assert selected_documents(rounds, per_round=2) == [(a, b), (c, a), (b, a), ()]
    texts = [state_text("Q", rounds[:t]) for t in range(5)]
    assert texts == [
        "Q",
        "Q[SEP]A: x",
        "Q[SEP]A: x[SEP]B: y",
        "Q[SEP]A: x[SEP]B: y[SEP]B: y",
        "Q[SEP]A: x[SEP]B: y[SEP]B: y[SEP]",
    ]
    assert len(set(texts)) == len(texts)


def _rows(f1s):
    rows = []
    for i, f1 in enumerate(f1s):
        rows.append(
            {
                "qid": "q",
                "iteration": i,
                "query": None if i == 0 else f"q{i}",
                "doc_ids": [f"d{i}", "dx", "dz"],
                "reasoning": f"r{i}",
                "probe_answer": f"a{i}",
                "probe_f1": f1,
            }
        )
    return rows


DOCS = {**{f"d{i}": (f"T{i}", f"text {i}") for i in range(5)}, "dx": ("X", "x"), "dz": ("Z", "z")}


def test_with_documents_and_rounds():
    rows = with_documents(_rows([0.0, 0.2]), DOCS, top_k=2)
    assert (
        rows[0]["doc_titles"] == [] and rows[1]["doc_titles"] == ["T1", "X"] and rows[1]["doc_texts"] == ["text 1", "x"]
    )
    (rnd,) = rounds_from_history(list(reversed(rows)))
    assert rnd == Round("q1", (("d1", "T1", "text 1"), ("dx", "X", "x")), "r1", "a1")
    with pytest.raises(KeyError, match="not in the corpus"):
        with_documents(_rows([0.1, 0.2]), {}, top_k=2)


def test_build_episode_from_iterations():
    rows = with_documents(list(reversed(_rows([0.0, 0.2, 0.7]))), DOCS, top_k=2)
    ep = build_episode("q", "Q?", rows)
    assert ep.iterations == (1, 2) and ep.rewards == (0.2, 0.7)
    assert ep.texts == ("Q?[SEP]T1: text 1", "Q?[SEP]T1: text 1[SEP]T2: text 2")
    ep0 = build_episode("q", "Q?", with_documents(_rows([0.0, 0.2]), DOCS, 2), first_decision=0)
    assert ep0.iterations == (0, 1) and ep0.texts[0] == "Q?"
    # rewards from one answer generator replace the probes', the terminal state's included
    assert build_episode("q", "Q?", rows, rewards={0: 0.0, 1: 0.5, 2: 0.25}).rewards == (0.5, 0.25)
    # a trajectory that answered before any retrieval keeps its only (terminal) state
    assert build_episode("q", "Q?", with_documents(_rows([0.4]), DOCS, 2)).iterations == (0,)


def test_build_episode_bad_input():
    rows = with_documents(_rows([0.1, 0.2, 0.3]), DOCS, 2)
    with pytest.raises(ValueError, match="without gaps"):
        build_episode("q", "Q?", [rows[0], rows[2]])
    rows[1]["probe_f1"] = None  # a probe that produced nothing scores 0, as in the shared evaluator
    assert build_episode("q", "Q?", rows).rewards == (0.0, 0.3)


def test_training_samples_indices_and_filter():
    eps = [
        Episode("a", (1, 2, 3), ("a1", "a2", "a3"), (0.2, 0.5, 1.0)),
        Episode("z", (1, 2), ("z1", "z2"), (0.0, 0.0)),  # no signal: dropped from samples, kept in table
        Episode("b", (1,), ("b1",), (0.3,)),  # terminal only: no sample
    ]
    texts, samples = training_samples(eps)
    assert texts == ["a1", "a2", "a3", "z1", "z2", "b1"]
    assert samples == [
        Sample(0, 0.2, (0.5, 1.0), (1,)),
        Sample(1, 0.5, (1.0,), ()),
    ]
    assert len(training_samples(eps, drop_no_signal=False)[1]) == 3

"""The 4-state heuristic pinned on hand-built trajectories (FIDELITY.md, the seed's joint_controller)."""

import random
from typing import get_args

import pytest

from raypipe.agents.hooks import StopDecision
from raypipe.core.config import PAPER_THETA_P, PAPER_THETA_U, HeuristicVariant, StoppingConfig
from raypipe.stopping.heuristic import (
    HIGH_HIGH,
    HIGH_P_LOW_U,
    LOW_LOW,
    LOW_P_HIGH_U,
    PAPER_OPTIONS,
    PAPER_THRESHOLDS,
    VARIANTS,
    FourStateHeuristic,
    HeuristicOptions,
    Thresholds,
    classify,
    replay_controller,
)
from raypipe.stopping.replay import Trajectory

TH = Thresholds(theta_p=0.5, theta_u=0.0)
# Predictions that put an iteration in each state under TH.
S = {0: (0.8, 0.2), 1: (0.8, -0.2), 2: (0.2, 0.2), 3: (0.2, -0.2)}


def run(states, options=None, iteration0=None):
    """Feed iterations 1..len(states) (and optionally iteration 0) in the given states; first stop or None."""
    h = FourStateHeuristic(TH, options or HeuristicOptions())
    if iteration0 is not None:
        d = h.step(0, *iteration0)
        if d.stop:
            return 0, d
    for i, s in enumerate(states, start=1):
        d = h.step(i, *S[s])
        if d.stop:
            return i, d
    return None


@pytest.mark.parametrize(
    "p,u,state",
    [
        (0.8, 0.2, HIGH_HIGH),
        (0.8, -0.2, HIGH_P_LOW_U),
        (0.2, 0.2, LOW_P_HIGH_U),
        (0.2, -0.2, LOW_LOW),
        (0.5, 0.0, HIGH_HIGH),  # both exactly at the thresholds: high
        (0.5, -1e-9, HIGH_P_LOW_U),
        (0.5 - 1e-9, 0.0, LOW_P_HIGH_U),
        (0.5 - 1e-9, -1e-9, LOW_LOW),
    ],
)
def test_classify_with_closed_boundaries(p, u, state):
    assert classify(p, u, TH) == state


def test_paper_thresholds_boundary():
    th = Thresholds(0.3, 0.2)
    assert classify(0.3, 0.2, th) == HIGH_HIGH
    assert classify(0.29999, 0.2, th) == LOW_P_HIGH_U


def test_state0_stops_immediately_with_current_answer():
    assert run([2, 0, 1]) == (2, StopDecision(True, 2, "state0"))
    assert run([0]) == (1, StopDecision(True, 1, "state0"))


def test_state1_alone_continues_to_natural_end():
    assert run([1, 1, 1]) is None
    assert run([1, 2, 2]) is None


def test_state2_continues():
    assert run([2, 2, 2]) is None


def test_state3_without_earlier_high_quality_continues():
    assert run([3, 3, 2]) is None
    assert run([2, 3]) is None


def test_state3_rolls_back_to_earliest_state1():
    assert run([2, 1, 1, 3]) == (4, StopDecision(True, 2, "state3_rollback"))
    # a state 2 in between does not clear the candidate
    assert run([1, 2, 3]) == (3, StopDecision(True, 1, "state3_rollback"))
    # a state 3 before any candidate does nothing; the later one rolls back
    assert run([3, 1, 3]) == (3, StopDecision(True, 2, "state3_rollback"))


def test_state0_after_state1_stops_at_the_state0():
    assert run([1, 0]) == (2, StopDecision(True, 2, "state0"))


def test_iteration0_is_neither_a_stop_nor_a_rollback_target():
    # high/high before retrieval: ignored (the seed's rows start at the first retrieval iteration)
    assert run([2, 2], iteration0=(0.9, 0.9)) is None
    # high quality at 0 then low/low: no candidate to roll back to
    assert run([3, 3], iteration0=(0.9, None)) is None


def test_iteration0_option_allows_stopping_before_retrieval():
    opts = HeuristicOptions(first_iteration=0)
    # U_0 is undefined: it is taken as P̂_0 (utility over an empty answer)
    assert run([2], opts, iteration0=(0.9, None)) == (0, StopDecision(True, 0, "state0"))
    assert run([2], opts, iteration0=(0.4, None)) is None


def test_iterations_must_come_in_order():
    h = FourStateHeuristic(TH)
    h.step(1, *S[2])
    with pytest.raises(ValueError, match="in order"):
        h.step(3, *S[2])
    with pytest.raises(ValueError, match="first iteration fed is 2"):
        FourStateHeuristic(TH).step(2, *S[2])
    with pytest.raises(ValueError, match="no predicted utility"):
        FourStateHeuristic(TH).step(1, 0.5, None)


def test_states_are_recorded():
    h = FourStateHeuristic(TH)
    for i, s in enumerate([2, 3, 1, 2], start=1):
        h.step(i, *S[s])
    assert h.states == [2, 3, 1, 2]


def test_rollback_options():
    h = FourStateHeuristic(TH, HeuristicOptions(rollback="best"))
    assert not h.step(1, 0.6, -0.1).stop
    assert not h.step(2, 0.9, -0.1).stop
    assert h.step(3, *S[3]) == StopDecision(True, 2, "state3_rollback")
    assert run([1, 3], HeuristicOptions(rollback="none")) is None
    with pytest.raises(ValueError, match="rollback"):
        HeuristicOptions(rollback="latest")


def test_stop_on_high_p_option():
    assert run([2, 1], HeuristicOptions(stop_on_high_p=True)) == (2, StopDecision(True, 2, "state1"))


def test_give_up_option():
    opts = HeuristicOptions(give_up=True)
    assert run([2, 3], opts) == (2, StopDecision(True, 2, "state3_give_up"))
    # with an earlier high-quality answer, state 3 still rolls back to it
    assert run([1, 3], opts) == (2, StopDecision(True, 1, "state3_rollback"))
    assert run([2, 3]) is None  # the paper's heuristic does not give up


def test_utility_options():
    # P̂ rises by 0.3 but the utility head says -0.2
    seq = [(0, 0.4, None), (1, 0.7, -0.2)]

    def first_stop(opts):
        h = FourStateHeuristic(TH, opts)
        for i, p, u in seq:
            d = h.step(i, p, u)
            if d.stop:
                return i
        return None

    assert first_stop(HeuristicOptions()) is None  # state 1
    assert first_stop(HeuristicOptions(utility="delta_p")) == 1  # Û = 0.3: state 0
    assert first_stop(HeuristicOptions(utility="mean")) == 1  # Û = 0.05
    # without an iteration-0 prediction, delta_p falls back to the utility head at iteration 1
    h = FourStateHeuristic(TH, HeuristicOptions(utility="delta_p"))
    assert not h.step(1, 0.7, -0.2).stop


def reference(ps, us, th):
    """The rule as the paper states it, written independently: (decision index, answer index) or None."""
    states = [classify(p, u, th) for p, u in zip(ps, us)]
    for i, s in enumerate(states):
        if s == 0:
            return i, i
        earlier = [j for j in range(i) if states[j] in (0, 1)]
        if s == 3 and earlier:
            return i, earlier[0]
    return None


def test_matches_reference_rule_on_random_trajectories():
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 7)
        ps = [rng.choice([0.1, 0.3, 0.5, 0.7]) for _ in range(n)]
        us = [rng.choice([-0.2, 0.0, 0.2]) for _ in range(n)]
        th = Thresholds(rng.choice([0.3, 0.5]), rng.choice([0.0, 0.2]))
        h = FourStateHeuristic(th)
        got = None
        for i in range(n):
            d = h.step(i + 1, ps[i], us[i])
            if d.stop:
                got = (i, d.answer_iteration - 1)
                break
        assert got == reference(ps, us, th), (ps, us, th)


def traj(qid, n):
    return Trajectory(qid, "d", tuple(0.1 * i for i in range(n + 1)), (5,) * (n + 1), 0.9, 5 * (n + 1))


def test_replay_controller_decisions():
    preds = {
        "a": {1: S[1], 2: S[2], 3: S[3], 4: S[2]},  # rollback at 3 to 1
        "b": {0: (0.9, None), 1: S[2], 2: S[0]},  # stop at 2
        "c": {1: S[2], 2: S[2]},  # natural
    }
    ctl = replay_controller(preds, TH)
    da = ctl(traj("a", 4))
    assert (da.decision_iteration, da.answer_iteration, da.reason) == (3, 1, "state3_rollback")
    db = ctl(traj("b", 2))
    assert (db.decision_iteration, db.answer_iteration) == (2, 2)
    dc = ctl(traj("c", 2))
    assert (dc.decision_iteration, dc.answer_iteration, dc.reason) == (2, None, "natural")
    with pytest.raises(ValueError, match="no predictions for question z"):
        ctl(traj("z", 1))
    with pytest.raises(ValueError, match="no prediction for iteration 3"):
        ctl(traj("c", 3))


def test_replay_no_retrieval_trajectory_is_natural():
    d = replay_controller({"a": {0: (0.9, None)}}, TH)(traj("a", 0))
    assert (d.decision_iteration, d.answer_iteration) == (0, None)
    d = replay_controller({}, TH)(traj("b", 0))  # predictions start at iteration 1
    assert (d.decision_iteration, d.answer_iteration) == (0, None)


def test_named_variants_are_the_configs_and_paper_is_the_default():
    assert list(VARIANTS) == list(get_args(HeuristicVariant)) == StoppingConfig().variants
    assert VARIANTS["paper"] == PAPER_OPTIONS == HeuristicOptions()
    config = StoppingConfig()
    assert PAPER_THRESHOLDS == Thresholds(config.theta_p, config.theta_u) == Thresholds(PAPER_THETA_P, PAPER_THETA_U)
    assert (PAPER_THETA_P, PAPER_THETA_U) == (0.3, 0.2)  # the paper's operating point

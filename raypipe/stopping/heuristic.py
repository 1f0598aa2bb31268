"""The seed paper's 4-state early-stopping heuristic with rollback (Tian et al., Section 4).

Each retrieval iteration gets a state from the predicted quality P̂ and utility Û (a value equal to a
threshold counts as high): 0 high/high, 1 high P̂ low Û, 2 low P̂ high Û, 3 low/low.
State 0 stops and returns the current probed answer. State 3 after an earlier state 0 or 1 stops and
returns the earliest such answer; the cost is counted up to the current iteration (state 3 had to be
observed first). Anything else continues, to natural termination if nothing fires.

As in the public controller (``control/joint_controller.py``), the states run over the retrieval
iterations 1..n only: the probe before any retrieval (iteration 0, where U is undefined) is neither a
stopping point nor a rollback target. :class:`HeuristicOptions` holds named departures from that
behaviour; its defaults are the paper's, and :data:`VARIANTS` names the ones the sweep and the online
controller offer.

:class:`FourStateHeuristic` is streaming (one iteration at a time), so the offline replay and the
online controller run the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.config import PAPER_THETA_P, PAPER_THETA_U
from raypipe.stopping.replay import Decision, OfflineController, Trajectory, natural_decision

HIGH_HIGH, HIGH_P_LOW_U, LOW_P_HIGH_U, LOW_LOW = 0, 1, 2, 3


@dataclass(frozen=True)
class Thresholds:
    theta_p: float
    theta_u: float


PAPER_THRESHOLDS = Thresholds(theta_p=PAPER_THETA_P, theta_u=PAPER_THETA_U)  # the paper's operating point


def classify(p_hat: float, u_hat: float, thresholds: Thresholds) -> int:
    """The state of one iteration; values exactly at a threshold count as high."""
    high_p = p_hat >= thresholds.theta_p
    high_u = u_hat >= thresholds.theta_u
    if high_p:
        return HIGH_HIGH if high_u else HIGH_P_LOW_U
    return LOW_P_HIGH_U if high_u else LOW_LOW


@dataclass(frozen=True)
class HeuristicOptions:
    """Named variants of the heuristic; the defaults reproduce the paper.

    rollback: which earlier high-quality answer state 3 returns: ``earliest`` (paper), ``best`` (the
      one with the highest P̂), or ``none`` (state 3 never stops).
    stop_on_high_p: also stop immediately in state 1 (a quality floor that ignores Û).
    give_up: state 3 with no earlier high-quality answer also stops, returning the current answer (a
      trajectory predicted to be going nowhere ends early; for weak agents whose answers rarely improve).
    first_iteration: the first iteration the states cover; 1 (paper) skips the pre-retrieval probe,
      0 lets the controller answer before any retrieval (there Û_0 = P̂_0: utility over no answer).
    utility: the Û the states use: ``predicted`` (paper: the utility head's output), ``delta_p``
      (P̂_i − P̂_{i−1} from the quality head, P̂ before iteration 0 = 0), or ``mean`` of the two.
    """

    rollback: Literal["earliest", "best", "none"] = "earliest"
    stop_on_high_p: bool = False
    give_up: bool = False
    first_iteration: int = 1
    utility: Literal["predicted", "delta_p", "mean"] = "predicted"

    def __post_init__(self):
        if self.rollback not in ("earliest", "best", "none"):
            raise ValueError(f"rollback must be earliest, best or none, got {self.rollback!r}")
        if self.first_iteration not in (0, 1):
            raise ValueError(f"first_iteration must be 0 or 1, got {self.first_iteration!r}")
        if self.utility not in ("predicted", "delta_p", "mean"):
            raise ValueError(f"utility must be predicted, delta_p or mean, got {self.utility!r}")


def effective_utility(
    options: HeuristicOptions, iteration: int, p_hat: float, u_hat: float | None, prev_p_hat: float | None
) -> float:
    """The Û the states use (``options.utility``); ``prev_p_hat`` is None when P̂_{i-1} is unknown."""
    if u_hat is None:
        if iteration != 0:
            raise ValueError(f"no predicted utility at iteration {iteration}")
        u_hat = p_hat  # U_0 over an empty answer
    if options.utility == "predicted" or prev_p_hat is None:
        return u_hat
    delta = p_hat - prev_p_hat
    return delta if options.utility == "delta_p" else (u_hat + delta) / 2


PAPER_OPTIONS = HeuristicOptions()

# Named heuristic variants (stopping.variant / stopping.variants); "paper" is the faithful one.
VARIANTS: dict[str, HeuristicOptions] = {
    "paper": PAPER_OPTIONS,
    "delta_p": HeuristicOptions(utility="delta_p"),
    "mean_utility": HeuristicOptions(utility="mean"),
    "best_rollback": HeuristicOptions(rollback="best"),
    "quality_floor": HeuristicOptions(stop_on_high_p=True),
    "give_up": HeuristicOptions(give_up=True),
}


class FourStateHeuristic:
    """The heuristic over one trajectory, fed iteration by iteration in order."""

    def __init__(self, thresholds: Thresholds, options: HeuristicOptions = PAPER_OPTIONS):
        self.thresholds = thresholds
        self.options = options
        self.states: list[int] = []
        self.signals: list[tuple[float, float]] = []  # (P̂, Û) of each classified iteration
        self._candidates: list[tuple[int, float]] = []  # (iteration, p_hat) of states 0/1 so far
        self._last_iteration: int | None = None
        self._last_p_hat: float | None = None

    def step(self, iteration: int, p_hat: float, u_hat: float | None) -> StopDecision:
        """The decision after iteration ``iteration`` given its predictions (``u_hat`` may be None at 0)."""
        if self._last_iteration is not None and iteration != self._last_iteration + 1:
            raise ValueError(f"iterations must come in order: got {iteration} after {self._last_iteration}")
        if self._last_iteration is None and iteration > self.options.first_iteration:
            raise ValueError(f"first iteration fed is {iteration}, expected {self.options.first_iteration} or earlier")
        prev_p_hat = self._last_p_hat if self._last_iteration is not None else (0.0 if iteration == 0 else None)
        self._last_iteration, self._last_p_hat = iteration, p_hat
        if iteration < self.options.first_iteration:
            return CONTINUE
        u_eff = effective_utility(self.options, iteration, p_hat, u_hat, prev_p_hat)
        state = classify(p_hat, u_eff, self.thresholds)
        self.states.append(state)
        self.signals.append((p_hat, u_eff))
        if state == HIGH_HIGH:
            return StopDecision(stop=True, answer_iteration=iteration, reason="state0")
        if state == HIGH_P_LOW_U:
            self._candidates.append((iteration, p_hat))
            if self.options.stop_on_high_p:
                return StopDecision(stop=True, answer_iteration=iteration, reason="state1")
        if state == LOW_LOW and self._candidates and self.options.rollback != "none":
            if self.options.rollback == "earliest":
                target = self._candidates[0][0]
            else:  # best: highest P̂, earliest on ties
                target = max(self._candidates, key=lambda c: (c[1], -c[0]))[0]
            return StopDecision(stop=True, answer_iteration=target, reason="state3_rollback")
        if state == LOW_LOW and not self._candidates and self.options.give_up:
            return StopDecision(stop=True, answer_iteration=iteration, reason="state3_give_up")
        return CONTINUE


Predictions = Mapping[str, Mapping[int, tuple[float, float | None]]]  # qid -> iteration -> (P̂, Û)


def _feed(heuristic: FourStateHeuristic, trajectory: Trajectory, preds: Mapping[int, tuple]) -> Decision:
    """Run the heuristic over a recorded trajectory's predictions, in order; its decision."""
    start = 0 if 0 in preds else 1
    for i in range(start, trajectory.n_iterations + 1):
        if i not in preds:
            raise ValueError(f"question {trajectory.qid}: no prediction for iteration {i}")
        decision = heuristic.step(i, *preds[i])
        if decision.stop:
            return Decision(decision_iteration=i, answer_iteration=decision.answer_iteration, reason=decision.reason)
    return natural_decision(trajectory)


def _predictions_of(predictions: Predictions, trajectory: Trajectory) -> Mapping[int, tuple] | None:
    preds = predictions.get(trajectory.qid)
    if preds is None and trajectory.n_iterations > 0:
        raise ValueError(f"no predictions for question {trajectory.qid}")
    return preds  # None: answered without retrieval, nothing to decide


def replay_controller(
    predictions: Predictions, thresholds: Thresholds, options: HeuristicOptions = PAPER_OPTIONS
) -> OfflineController:
    """The heuristic as an offline controller over per-qid predictions (for :mod:`evaluate`).

    Predictions for iteration 0 are optional unless ``options.first_iteration`` is 0 (with ``delta_p``
    they give P̂_0 for Û_1; without them Û_1 falls back to the utility head).
    """

    def controller(trajectory: Trajectory) -> Decision:
        preds = _predictions_of(predictions, trajectory)
        if preds is None:
            return natural_decision(trajectory)
        return _feed(FourStateHeuristic(thresholds, options), trajectory, preds)

    return controller


def classified_signals(
    predictions: Predictions, trajectory: Trajectory, options: HeuristicOptions = PAPER_OPTIONS
) -> list[tuple[float, float]]:
    """The (P̂, Û) pairs the heuristic classifies on a whole trajectory (Û as ``options.utility`` forms it).

    The heuristic's decision depends on the thresholds only through comparisons with these values,
    which lets a sweep evaluate each distinct pattern of comparisons once.
    """
    preds = _predictions_of(predictions, trajectory)
    if preds is None:
        return []
    never = FourStateHeuristic(Thresholds(math.inf, -math.inf), options)  # always state 2: never stops
    _feed(never, trajectory, preds)
    return never.signals

"""Baselines: natural stopping and Cap@k (at most k retrieval iterations)."""

from __future__ import annotations

from raypipe.stopping.replay import Decision, OfflineController, Trajectory, natural_decision


def natural(trajectory: Trajectory) -> Decision:
    """Let the agent run to its own end and return its final answer."""
    return natural_decision(trajectory)


def cap(k: int) -> OfflineController:
    """Stop after retrieval iteration k and return that iteration's probed answer.

    A trajectory that ends by itself within k iterations keeps its natural answer and cost.
    """
    if k < 0:
        raise ValueError(f"cap must be >= 0, got {k}")

    def controller(trajectory: Trajectory) -> Decision:
        if trajectory.n_iterations <= k:
            return natural_decision(trajectory)
        return Decision(decision_iteration=k, answer_iteration=k, reason=f"cap{k}")

    controller.__name__ = f"cap{k}"
    return controller

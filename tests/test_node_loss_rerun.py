"""rerun_on_node_loss (raypipe/runtime/cluster.py): a step that a lost node ended runs again, bounded; any other
failure is raised as it is. Ray's node table is faked (the step's failures are the thing under test); the real
node loss is tests/test_sim_cluster.py::test_a_node_lost_while_features_run_loses_and_duplicates_no_row."""

import sys
import types

import pytest

from raypipe.runtime.cluster import rerun_on_node_loss


@pytest.fixture
def nodes(monkeypatch):
    """The alive node ids ``ray.nodes()`` reports (edit the set to lose a node)."""
    alive = {"a", "b"}
    fake = types.SimpleNamespace(nodes=lambda: [{"NodeID": n, "Alive": True} for n in sorted(alive)])
    monkeypatch.setitem(sys.modules, "ray", fake)
    return alive


def test_a_step_ended_by_a_lost_node_runs_again(nodes):
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            nodes.discard("b")  # the node goes while the step runs
            raise RuntimeError("ActorDiedError: the actor's node was terminated")
        return "written"

    assert rerun_on_node_loss(step, "features") == "written" and len(calls) == 2


def test_a_failure_without_a_lost_node_is_raised_at_once(nodes):
    calls = []

    def step():
        calls.append(1)
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        rerun_on_node_loss(step, "features")
    assert len(calls) == 1


def test_reruns_are_bounded(nodes):
    calls = []

    def step():
        calls.append(1)
        nodes.add(f"n{len(calls)}")  # a replacement joins, then is lost again
        nodes.discard(f"n{len(calls) - 1}" if len(calls) > 1 else "b")
        raise RuntimeError("node lost")

    with pytest.raises(RuntimeError, match="node lost"):
        rerun_on_node_loss(step, "features", reruns=2)
    assert len(calls) == 3

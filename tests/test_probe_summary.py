"""The probe job's console summary, with and without an online controller's cost."""

import pyarrow as pa
import pytest

from raypipe.analysis.probe_summary import format_summary, summarize
from raypipe.core.rundir import RunDir


def run_dir(tmp_path, decisions):
    """Two trajectories of 2 s each; iteration rows with the given decision_s (None: no controller)."""
    run = RunDir(tmp_path / "run")
    trajectories = [
        {"qid": q, "dataset": "toy", "n_iterations": 1, "final_f1": 1.0, "stop_reason": "answer", "wall_s": 2.0}
        for q in ("a", "b")
    ]
    iterations = [
        {"qid": q, "dataset": "toy", "iteration": i, "probe_f1": 0.5, "decision_s": d}
        for q in ("a", "b")
        for i, d in enumerate(decisions)
    ]
    run.write_part("trajectories", pa.Table.from_pylist(trajectories), "part-0")
    run.write_part("iterations", pa.Table.from_pylist(iterations), "part-0")
    return run


def test_without_a_controller_the_summary_has_no_cost_line(tmp_path):
    rows = summarize(run_dir(tmp_path, [None, None]))
    assert "decisions" not in rows[0]
    assert "controller" not in format_summary(rows)


def test_with_a_controller_the_summary_shows_its_share_of_wall_time(tmp_path):
    (row,) = summarize(run_dir(tmp_path, [0.1, 0.3]), controller=True)
    assert row["decisions"] == 4 and row["decision_s"] == pytest.approx(0.2)
    assert row["controller_share"] == pytest.approx(0.8 / 4.0)  # summed decisions over summed wall time
    assert "toy: controller 4 decisions, 200.0 ms each, 20.0% of the trajectories' wall time" in format_summary([row])

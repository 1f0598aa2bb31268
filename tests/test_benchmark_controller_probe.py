"""benchmarks/controller_probe.py: a probe run's figures are read from its tables and probe_info.yaml, and the
savings line divides the wall saved by the iterations saved, per repeat."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from raypipe.core.rundir import RunDir
from raypipe.core.schema import ITERATIONS, TRAJECTORIES
from tests.helpers.benchmarks import imported_benchmark


@pytest.fixture(scope="module")
def bench():
    with imported_benchmark("controller_probe") as module:
        yield module


def test_job_figures_read_the_run(bench, tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    info = {"generation_seconds": 50.0, "engines": [{"actor_start_seconds": 8.0}, {"actor_start_seconds": 10.0}]}
    (run.path / "probe_info.yaml").write_text(yaml.safe_dump(info))
    base = {"dataset": "hotpotqa", "question": "q", "golden_answers": ["a"], "stop_reason": "answer"}
    trajectories = [{**base, "qid": "a", "n_iterations": 2, "final_f1": 1.0}, {**base, "qid": "b", "n_iterations": 1}]
    iterations = [
        {"qid": "a", "dataset": "hotpotqa", "iteration": 0, "engine_s": 9.0, "decision_s": None},
        {"qid": "a", "dataset": "hotpotqa", "iteration": 1, "engine_s": 2.0, "decision_s": 0.1},
        {"qid": "a", "dataset": "hotpotqa", "iteration": 2, "engine_s": 4.0, "decision_s": 0.3},
    ]
    run.write_part("trajectories", pa.Table.from_pylist(trajectories, schema=TRAJECTORIES), "part-0")
    run.write_part("iterations", pa.Table.from_pylist(iterations, schema=ITERATIONS), "part-0")
    figures = bench.job_figures(run)
    assert figures["questions"] == 2 and figures["iterations"] == 3
    assert figures["final_f1"] == pytest.approx(1.0)  # the null F1 is not counted as 0 by the mean
    assert figures["after_start_s"] == pytest.approx(40.0)  # after the slower engine's start
    assert figures["decisions"] == 2 and figures["decision_s"] == pytest.approx(0.2)
    assert figures["decision_median_s"] == pytest.approx(0.2)
    assert figures["iteration_engine_s"] == pytest.approx(3.0)  # iteration 0 (no retrieval) left out


def test_report_divides_the_wall_saved_by_the_iterations_saved(bench):
    def job(wall, iterations, f1, decision_s=None):
        return {
            "wall_s": wall,
            "generation_s": wall - 20,
            "after_start_s": wall - 30,
            "iterations": iterations,
            "final_f1": f1,
            "decisions": 80 if decision_s else 0,
            "decision_s": decision_s,
            "decision_median_s": decision_s,
            "iteration_engine_s": 1.0 if decision_s else None,
        }

    natural = [job(230, 100, 0.2), job(230, 100, 0.2), job(230, 100, 0.2)]
    controller = [job(200, 80, 0.19, 0.05), job(190, 80, 0.19, 0.05), job(210, 80, 0.19, 0.05)]
    text = bench.report(natural, controller)
    assert "iterations saved: 20.0% [20.0%-20.0%]" in text
    # after the start: 1 - 170/200 = 15% (0.75 of 20%), ranging 1 - 180/200 = 10% to 1 - 160/200 = 20%
    assert "after start saved: 15.0% [10.0%-20.0%]; over iterations saved: 0.75 [0.50-1.00]" in text
    assert "F1, controller over natural: 95.0%" in text
    assert "decision over iteration: 5.0% [5.0%-5.0%] (80 decisions a run)" in text

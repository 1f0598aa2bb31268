"""Retrying transient failures on a rerun (issues 27, 41): which rows go, when, in which order, and nothing doubled."""

import pyarrow as pa
import pytest

from raypipe.core import retry
from raypipe.core.rundir import RunDir
from raypipe.core.schema import ITERATIONS, STOP_REASONS, TRAJECTORIES, TRANSIENT_STOP_REASONS


def trajectory(qid: str, reason: str) -> dict:
    row = dict.fromkeys(TRAJECTORIES.names)
    row.update(qid=qid, dataset="toy", question=f"{qid}?", golden_answers=["x"], stop_reason=reason, n_iterations=1)
    return row


def iteration_rows(qid: str, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        row = dict.fromkeys(ITERATIONS.names)
        row.update(qid=qid, dataset="toy", iteration=i)
        rows.append(row)
    return rows


def write_run(path, parts: dict[str, list[tuple[str, str]]]) -> RunDir:
    run = RunDir(path)
    for part, rows in parts.items():
        run.write_part(
            "iterations",
            pa.Table.from_pylist([r for q, _ in rows for r in iteration_rows(q, 2)], schema=ITERATIONS),
            part,
        )
        run.write_part(
            "trajectories",
            pa.Table.from_pylist([trajectory(q, reason) for q, reason in rows], schema=TRAJECTORIES),
            part,
        )
    return run


def qids(run: RunDir, table: str) -> list[str]:
    return sorted(run.read(table, columns=["qid"]).column("qid").to_pylist())


def test_only_outage_reasons_are_transient():
    assert set(TRANSIENT_STOP_REASONS) == {"engine_error", "retrieval_error"}
    for own in ("engine_crash", "context_overflow", "internal_error", "query_crash", "no_valid_action"):
        assert own in STOP_REASONS and own not in TRANSIENT_STOP_REASONS


def test_a_rerun_keeps_the_questions_own_failures_and_removes_nothing_before_the_drop(tmp_path, caplog):
    """Deterministic failures (a bug or refused request: internal_error; a query that crashed its replica alone:
    query_crash) are not retried; planning the retry removes nothing (the rows go only once the rerun's engine
    and retrieval answer, :func:`retry.drop_retried`)."""
    run = write_run(
        tmp_path / "run",
        {
            "part-a": [("a1", "internal_error"), ("a2", "query_crash"), ("a3", "engine_error")],
            "part-b": [("b1", "retrieval_error"), ("b2", "engine_crash")],
        },
    )
    caplog.set_level("INFO")
    planned = retry.plan_retry(run)
    assert planned == {"a3": "engine_error", "b1": "retrieval_error"}
    assert "retrying 2 questions" in caplog.text and "engine_error 1, retrieval_error 1" in caplog.text
    assert qids(run, "trajectories") == ["a1", "a2", "a3", "b1", "b2"]  # nothing removed yet
    assert len(qids(run, "iterations")) == 10
    assert retry.drop_retried(run, planned) == 2
    assert qids(run, "trajectories") == ["a1", "a2", "b2"] and qids(run, "iterations") == [
        "a1",
        "a1",
        "a2",
        "a2",
        "b2",
        "b2",
    ]


def test_retry_takes_out_exactly_the_transient_rows_from_both_tables(tmp_path, caplog):
    run = write_run(
        tmp_path / "run",
        {
            "part-a": [("a1", "answer"), ("a2", "retrieval_error"), ("a3", "engine_crash")],
            "part-b": [("b1", "engine_error"), ("b2", "retrieval_error")],  # every row goes: the part is deleted
            "part-c": [("c1", "max_turns"), ("c2", "context_overflow")],
        },
    )
    caplog.set_level("INFO")
    failed = retry.plan_retry(run)
    assert failed == {"a2": "retrieval_error", "b1": "engine_error", "b2": "retrieval_error"}
    assert retry.drop_retried(run, failed) == 3
    assert qids(run, "trajectories") == ["a1", "a3", "c1", "c2"]
    assert qids(run, "iterations") == sorted(["a1", "a1", "a3", "a3", "c1", "c1", "c2", "c2"])
    assert sorted(p.stem for p in run.table_dir("trajectories").glob("*.parquet")) == ["part-a", "part-c"]
    assert sorted(p.stem for p in run.table_dir("iterations").glob("*.parquet")) == ["part-a", "part-c"]
    assert "retrying 3 questions" in caplog.text and "engine_error 1, retrieval_error 2" in caplog.text
    assert retry.plan_retry(run) == {}  # nothing left to retry: a second call changes nothing
    assert qids(run, "trajectories") == ["a1", "a3", "c1", "c2"]


def test_a_crash_between_the_two_tables_leaves_no_question_twice(tmp_path, monkeypatch):
    """Iterations go first: a crash before trajectories are rewritten leaves the old row (retried again)."""
    run = write_run(tmp_path / "run", {"part-a": [("a1", "answer"), ("a2", "retrieval_error")]})
    real_write = RunDir.write_part

    def crash_on_trajectories(self, name, table, part):
        if name == "trajectories":
            raise KeyboardInterrupt
        return real_write(self, name, table, part)

    monkeypatch.setattr(RunDir, "write_part", crash_on_trajectories)
    with pytest.raises(KeyboardInterrupt):
        retry.drop_retried(run, retry.plan_retry(run))
    monkeypatch.setattr(RunDir, "write_part", real_write)
    assert qids(run, "iterations") == ["a1", "a1"]  # a2's iterations are gone, its row not yet
    assert retry.transient_failures(run) == {"a2": "retrieval_error"}  # so the next rerun retries it
    retry.drop_retried(run, retry.plan_retry(run))
    assert qids(run, "trajectories") == ["a1"] and qids(run, "iterations") == ["a1", "a1"]


def test_reasons_can_be_narrowed_and_an_empty_run_has_nothing(tmp_path):
    run = write_run(tmp_path / "run", {"part-a": [("a1", "engine_error"), ("a2", "retrieval_error")]})
    assert retry.drop_retried(run, retry.plan_retry(run, ("retrieval_error",))) == 1
    assert qids(run, "trajectories") == ["a1"]
    assert retry.plan_retry(RunDir(tmp_path / "none")) == {}
    assert retry.plan_retry(run, only={"x"}) == {}  # a1 is not among the questions this rerun runs: it stays

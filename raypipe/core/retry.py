"""Retrying, on a rerun, the questions whose row ended for a passing reason (an outage, not the question).

A retrieval server down for a minute, or an OpenAI-compatible engine server restarting, ends every
trajectory then in flight with ``retrieval_error`` or ``engine_error`` (:data:`TRANSIENT_STOP_REASONS`).
A question's own failures (``internal_error``, ``query_crash``, ``engine_crash``, ``context_overflow``, ...)
would fail the same way again and stay. A rerun into the same run directory runs the outage rows'
questions again (:func:`plan_retry`) and takes their old rows out of the tables (:func:`drop_retried`) only
once its engine and retrieval have answered (the job's first new batch), so a rerun that cannot start
its engine or reach retrieval removes nothing; the tables keep exactly one row per question. The rows
are removed ``iterations/`` first, then ``trajectories/``: a crash at any point leaves either the old row
(retried on the next rerun) or none (run on the next rerun), never two rows of one question.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypipe.core.rundir import RunDir
from raypipe.core.schema import TRANSIENT_STOP_REASONS

log = logging.getLogger(__name__)


def transient_failures(run_dir: RunDir, reasons: Collection[str] = TRANSIENT_STOP_REASONS) -> dict[str, str]:
    """qid -> stop_reason of the written trajectories that ended for one of ``reasons``."""
    if not run_dir.has("trajectories"):
        return {}
    table = run_dir.read("trajectories", columns=["qid", "stop_reason"])
    return {
        qid: reason
        for qid, reason in zip(table.column("qid").to_pylist(), table.column("stop_reason").to_pylist())
        if reason in reasons
    }


def drop_questions(run_dir: RunDir, qids: Collection[str]) -> int:
    """Rewrite every part of ``iterations/``, then of ``trajectories/``, without the rows of ``qids``
    (each part atomically; a part left empty is deleted). Returns the trajectory rows removed."""
    if not qids:
        return 0
    drop = pa.array(sorted(qids), type=pa.string())
    removed = 0
    for name in ("iterations", "trajectories"):
        folder = run_dir.table_dir(name)
        for part in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            table = pq.read_table(part)
            keep = pc.invert(pc.is_in(table.column("qid"), value_set=drop))
            kept = table.filter(keep)
            if kept.num_rows == table.num_rows:
                continue
            if name == "trajectories":
                removed += table.num_rows - kept.num_rows
            if kept.num_rows:
                run_dir.write_part(name, kept, part.stem)
            else:
                part.unlink()
    return removed


def plan_retry(
    run_dir: RunDir, reasons: Collection[str] = TRANSIENT_STOP_REASONS, only: Collection[str] | None = None
) -> dict[str, str]:
    """qid -> reason of the transient failures this rerun runs again (logged: how many and why); nothing is
    removed yet (:func:`drop_retried`). ``only``: the questions this rerun will run (a failure outside them
    stays, or it would be lost)."""
    failed = transient_failures(run_dir, reasons)
    if only is not None:
        failed = {qid: reason for qid, reason in failed.items() if qid in only}
    if failed:
        counts = ", ".join(f"{reason} {n}" for reason, n in sorted(Counter(failed.values()).items()))
        log.info(
            "retrying %d questions that ended for a passing reason (%s); --no-retry keeps them", len(failed), counts
        )
    return failed


def drop_retried(run_dir: RunDir, failed: Collection[str]) -> int:
    """Take the rows of the questions being retried out of the tables, once the rerun's engine and retrieval
    have answered (before its first new rows are written). Returns the trajectory rows removed."""
    removed = drop_questions(run_dir, failed)
    if removed:
        log.info("the engine and retrieval answer: the old rows of the %d retried questions are removed", removed)
    return removed

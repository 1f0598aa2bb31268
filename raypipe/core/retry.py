"""Retrying, on a rerun, the questions whose row ended for a passing reason (an outage, not the question).

A retrieval server down for a minute, or an OpenAI-compatible engine server restarting, ends every
trajectory then in flight with ``retrieval_error`` or ``engine_error`` (:data:`TRANSIENT_STOP_REASONS`).
A rerun into the same run directory takes those questions out of the tables and runs them again, so the
tables keep exactly one row per question. The rows are removed before the questions run again, and
``iterations/`` before ``trajectories/``: a crash at any point leaves either the old row (retried on the
next rerun) or none (run on the next rerun), never two rows of one question.
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


def retry_transient(
    run_dir: RunDir, reasons: Collection[str] = TRANSIENT_STOP_REASONS, only: Collection[str] | None = None
) -> dict[str, str]:
    """Take the transient failures out of the run's tables so that the rerun runs them again; logs how
    many and why. ``only``: the questions this rerun will run (a failure outside them stays, or it would
    be lost). Returns qid -> the reason each one had."""
    failed = transient_failures(run_dir, reasons)
    if only is not None:
        failed = {qid: reason for qid, reason in failed.items() if qid in only}
    if failed:
        removed = drop_questions(run_dir, failed)
        counts = ", ".join(f"{reason} {n}" for reason, n in sorted(Counter(failed.values()).items()))
        log.info("retrying %d questions that ended for a passing reason (%s); --no-retry keeps them", removed, counts)
    return failed

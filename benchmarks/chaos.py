"""Reliability under faults and bad input: run every case of raypipe/testing/chaos.py and print a table.

Cases (the same as tests/test_chaos.py): a generation actor killed mid-job; a question that kills its
engine (or its actor's process) every time; a retrieval actor killed before a search, and a replica
killed while a search waits in it (retried, retries off, and a query that kills every replica); the
driver interrupted with SIGINT and with SIGTERM (stopped within 5 s) and rerun; bad input lines; a
10,000-character question and an engine error on single rows; a truncated index, an edited manifest
and a missing model; and Ray Train runs (cross-encoders, Stop-RAG against an uninterrupted run) whose
worker dies after a checkpoint. Everything runs on a local 2-CPU Ray with fake engines, a 40-passage
index and a tiny BERT, in a scratch directory that is removed unless a case fails. Exit status 1 when a
case fails. The same faults with the real vLLM engine are tests/test_engine_death.py.

    python benchmarks/chaos.py [-k SUBSTRING]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from raypipe.testing import chaos as cases
from raypipe.testing.tiny_models import tiny_bert

COLUMNS = ("case", "outcome", "rows in", "rows out", "duplicates", "time", "note")


def plan(work: Path) -> list[tuple[str, Callable[[Path], cases.Outcome]]]:
    """(name, run) for every case; the inputs some share (index, reference run, tiny model) are built once,
    when a case first needs them, and not counted in its time."""
    shared: dict[str, object] = {}

    def once(key: str, build: Callable[[Path], object]):
        if key not in shared:
            (work / key).mkdir()
            shared[key] = build(work / key)
        return shared[key]

    def index():
        return once("index", cases.index_config)

    def reference():
        return once("reference", cases.reference_run)

    def model():
        return once("tiny-bert", tiny_bert)

    return [
        ("generation actor killed", cases.generation_actor_killed),
        *((cases.KILLS[how][0], lambda d, how=how: cases.question_kills_every_time(d, reference(), how))
          for how in cases.KILLS),
        ("retrieval actor killed", lambda d: cases.retrieval_actor_killed(d, index())),
        *((f"retrieval replica killed in flight ({kind})",
           lambda d, kind=kind: cases.retrieval_replica_killed_in_flight(d, index(), kind))
          for kind in cases.REPLICA_KILLS),
        ("driver interrupted (SIGINT)", lambda d: cases.driver_interrupted(d, signal.SIGINT, reference())),
        ("driver interrupted (SIGTERM)", lambda d: cases.driver_interrupted(d, signal.SIGTERM, reference())),
        ("bad input", cases.bad_input),
        ("long question, engine error", cases.row_faults),
        ("broken index / missing model", lambda d: cases.broken_setup(d, index())),
        ("training interrupted (cross-encoders)", lambda d: cases.crossencoder_training_interrupted(d, model())),
        ("training interrupted (Stop-RAG)", lambda d: cases.stoprag_training_interrupted(d, model())),
    ]


def run_case(name: str, run: Callable[[Path], cases.Outcome], folder: Path) -> cases.Outcome:
    folder.mkdir()
    started = time.monotonic()
    try:
        outcome = run(folder)
    except Exception as exc:  # noqa: BLE001 - a case that crashes is a failed case, the others still run
        outcome = cases.Outcome(name, seconds=time.monotonic() - started, problems=[f"{type(exc).__name__}: {exc}"])
    outcome.case = name
    return outcome


def table(outcomes: list[cases.Outcome]) -> str:
    rows = [COLUMNS] + [
        (o.case, "pass" if o.passed else "FAIL", _dash(o.rows_in), _dash(o.rows_out), str(o.duplicates),
         f"{o.seconds:.0f} s", o.note)
        for o in outcomes
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", metavar="SUBSTRING", default="", help="only the cases whose name contains it")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    work = Path(tempfile.mkdtemp(prefix="raypipe-chaos-"))
    cases.init_local_ray()
    outcomes = []
    for name, run in plan(work):
        if args.k in name:
            outcomes.append(run_case(name, run, work / re.sub(r"\W+", "-", name).strip("-")))
            print(f"{outcomes[-1].case}: {'pass' if outcomes[-1].passed else 'FAIL'} ({outcomes[-1].seconds:.0f} s)",
                  flush=True)
    print("\n" + table(outcomes))
    failed = [o for o in outcomes if not o.passed]
    for o in failed:
        print(f"\n{o.case}:\n  " + "\n  ".join(o.problems))
    if failed:
        print(f"\nscratch directory kept: {work}")
        sys.exit(1)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()

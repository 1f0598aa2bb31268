"""Reliability under faults and bad input: run every case of raypipe/testing/chaos.py and print a table.

Cases (the same as tests/test_chaos.py): a generation actor killed mid-job; a question that kills its
engine (or its actor's process) every time; a retrieval actor killed before a search, and a replica
killed while a search waits in it (retried, retries off); a query that kills every retrieval replica
that searches it (one replica, two, retries off); the driver interrupted with SIGINT and with SIGTERM
(stopped within 5 s) and rerun; bad input lines; a 10,000-character question and an engine error on
single rows; a truncated index, an edited manifest and a missing model; and Ray Train runs
(cross-encoders, Stop-RAG against an uninterrupted run) whose worker dies after a checkpoint. These run
on a local 2-CPU Ray with fake engines, a 40-passage index and a tiny BERT. The last two rows (those of
tests/test_engine_death.py) run the real vLLM engine (the embedded model): its EngineCore process
SIGKILLed mid-batch, and a question that SIGKILLs it every time (five engine starts in all, about 50 s
each on 2 cores); ``--quick`` leaves them out. Everything runs in a scratch directory that is removed
unless a case fails. Exit status 1 when a case fails.

    python benchmarks/chaos.py [--quick] [-k SUBSTRING]
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
VLLM_ROWS = ("engine SIGKILL mid-batch (vLLM)", "question kills its engine every time (vLLM)")


def plan(work: Path) -> list[tuple[str, Callable[[Path], cases.Outcome]]]:
    """(name, run) for every case; the inputs some share (index, reference runs, tiny model, the vLLM
    setup) are built once, when a case first needs them, and not counted in its time."""
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

    def retrieval_reference():
        return once("retrieval-reference", lambda d: cases.retrieval_reference(d, index()))

    def vllm():
        return once("vllm", lambda d: cases.vllm_setup(
            cases.paragraph_corpus(d / "corpus.jsonl", ("hotpotqa",), cases.VLLM_QUESTIONS + 1)))

    def engine_killed(folder: Path) -> cases.Outcome:  # the SIGKILL row; its run is the next row's reference
        outcome, shared["killed-once"] = cases.engine_core_killed(folder, *vllm())
        return outcome

    def killed_once():
        return once("killed-once", lambda d: cases.engine_core_killed(d, *vllm())[1])

    return [
        ("generation actor killed", cases.generation_actor_killed),
        *((cases.KILLS[how][0], lambda d, how=how: cases.question_kills_every_time(d, reference(), how))
          for how in cases.KILLS),
        ("retrieval actor killed", lambda d: cases.retrieval_actor_killed(d, index())),
        *((f"retrieval replica killed in flight ({kind})",
           lambda d, kind=kind: cases.retrieval_replica_killed_in_flight(d, index(), kind))
          for kind in cases.REPLICA_KILLS),
        *((f"poison retrieval query ({kind})",
           lambda d, kind=kind: cases.poison_retrieval_query(d, index(), retrieval_reference(), kind))
          for kind in cases.POISON_SEARCHES),
        ("driver interrupted (SIGINT)", lambda d: cases.driver_interrupted(d, signal.SIGINT, reference())),
        ("driver interrupted (SIGTERM)", lambda d: cases.driver_interrupted(d, signal.SIGTERM, reference())),
        ("bad input", cases.bad_input),
        ("long question, engine error", cases.row_faults),
        ("broken index / missing model", lambda d: cases.broken_setup(d, index())),
        ("training interrupted (cross-encoders)", lambda d: cases.crossencoder_training_interrupted(d, model())),
        ("training interrupted (Stop-RAG)", lambda d: cases.stoprag_training_interrupted(d, model())),
        (VLLM_ROWS[0], engine_killed),
        (VLLM_ROWS[1], lambda d: cases.question_kills_its_vllm_engine(d, *vllm(), killed_once())),
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
    parser.add_argument("--quick", action="store_true", help="leave out the rows that run the real vLLM engine")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    work = Path(tempfile.mkdtemp(prefix="raypipe-chaos-"))
    cases.init_local_ray()
    outcomes = []
    for name, run in plan(work):
        if args.k in name and not (args.quick and name in VLLM_ROWS):
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

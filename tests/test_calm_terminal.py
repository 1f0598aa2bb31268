"""What the probe job shows on a terminal (docs/engine.md, "What the terminal shows"), without Ray: the
driver's generation line from the crash ledger every 15 s with rate and ETA (a fake clock), the engine's
start, the encoder actors' passage count, and the workers' and libraries' chatter kept in log files."""

import asyncio
import io
import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa

from raypipe.core.config import load_config
from raypipe.core.progress import HEARTBEAT_S, Heartbeat, waiting
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.runtime.cluster import DRIVER_LOG, NoActionNotices, route_driver_logs
from raypipe.runtime.crashes import CrashLedger
from raypipe.runtime.generation_progress import GenerationReporter, engine_start_hint, show_actor_logs
from raypipe.runtime.index_build import BlockEncoder, _ipc_bytes
from raypipe.stages import probe
from raypipe.testing.fakes import FakeRetriever

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_driver_line_comes_every_15_s_from_engine_start_to_the_last_trajectory():
    clock = Clock()
    ledger = CrashLedger(clock=clock)
    reporter = GenerationReporter(12, "a first start compiles the model, a few minutes on CPU", clock=clock)
    status = lambda: asyncio.run(ledger.status())  # noqa: E731
    events = {  # seconds after the job's start -> what the generation actor tells the ledger
        5: lambda: ledger.engine_starting("a1"),
        50: lambda: ledger.engine_ready("a1", 45.0),
        52: lambda: _start(ledger, [f"q{i}" for i in range(12)]),
        **{70 + 9 * i: (lambda i=i: ledger.finished(f"q{i}")) for i in range(12)},
    }
    lines = []
    for second in range(200):
        if second in events:
            asyncio.run(events[second]())
        if second and second % HEARTBEAT_S == 0:  # the driver thread's beat
            lines.append((second, reporter.report(status())))
        clock.now += 1
    assert HEARTBEAT_S <= 15
    assert lines[0] == (15, "generation: engine starting (10s; a first start compiles the model, a few minutes on CPU)")
    assert lines[2] == (45, "generation: engine starting (40s; a first start compiles the model, a few minutes on CPU)")
    # from the first trajectory on: trajectories done of all, rate, ETA (or the time taken), in flight
    working = [line for _, line in lines[3:]]
    assert working[0] == "generation: 0/12 trajectories, 0.0/min, ETA ?, 12 in flight, engine started in 45s"
    # at 90 s: 3 finished (at 70, 79, 88 s) 38 s after the first start (52 s): 4.7/min, 9 left in 1m54s
    assert working[2] == "generation: 3/12 trajectories, 4.7/min, ETA 1m54s, 9 in flight"
    assert all("/min" in line and ("ETA" in line or "took" in line) for line in working)
    assert working[-1].startswith("generation: 12/12 trajectories,") and "took 2m" in working[-1]
    assert sum("engine started" in line for line in working) == 1


def test_the_eta_counts_the_turns_in_flight_so_side_by_side_trajectories_do_not_put_it_minutes_out():
    clock = Clock()
    ledger = CrashLedger(clock=clock)
    by_count = GenerationReporter(12, clock=clock)
    by_turns = GenerationReporter(12, clock=clock, turn_limit=4)
    early = CrashLedger(clock=clock)
    asyncio.run(_start(early, ["a", "b"]))
    early.turn_done("a")  # less than one trajectory's work in all (1 of 5 turns): no ETA yet
    assert GenerationReporter(2, clock=clock, turn_limit=4).line(asyncio.run(early.status())) == (
        "generation: 0/2 trajectories, 0.0/min, ETA ?, 2 in flight"
    )
    asyncio.run(_start(ledger, [f"q{i}" for i in range(12)]))
    for second in range(1, 32):  # every trajectory a turn each 10 s; q0 answers after its third
        clock.now += 1
        if second % 10 == 0:
            for i in range(12):
                ledger.turn_done(f"q{i}")
        if second == 30:
            asyncio.run(ledger.finished("q0"))
    ledger.turn_done("q0")  # a late report of a finished trajectory counts for nothing
    status = asyncio.run(ledger.status())
    assert (status.finished, status.in_flight, status.turns_in_flight) == (1, 11, 33)
    # the 11 in flight have done 3 of at most 5 turns each: 1 + 33/5 = 7.6 trajectories' work in 31 s,
    # 4.4 left: 17.9 s (they end at 40 s); by finished trajectories alone 11 more at 1 per 31 s: 5m41s
    assert by_turns.line(status) == "generation: 1/12 trajectories, 1.9/min, ETA 17s, 11 in flight"
    assert by_count.line(status) == "generation: 1/12 trajectories, 1.9/min, ETA 5m41s, 11 in flight"


def _start(ledger, qids):
    async def start():
        for qid in qids:
            await ledger.started(qid)

    return start()


def test_before_any_engine_the_line_says_the_actors_are_starting_and_a_death_is_a_warning(caplog):
    clock = Clock()
    ledger = CrashLedger(clock=clock)
    reporter = GenerationReporter(3, clock=clock, log=logging.getLogger("gen"))
    clock.now += 20
    assert reporter.report(asyncio.run(ledger.status())) == "generation: starting the generation actors (20s)"
    asyncio.run(_start(ledger, ["a", "b"]))
    asyncio.run(ledger.died(["a", "b"], "EngineCore died"))
    asyncio.run(ledger.engine_starting("x"))  # Ray restarts the actor
    with caplog.at_level("INFO", logger="gen"):
        line = reporter.report(asyncio.run(ledger.status()))
    assert line == "generation: 0/3 trajectories, 0.0/min, ETA ?, 0 in flight, 1 engine starting"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "an engine died (EngineCore died)" in warnings[0]
    reporter.report(asyncio.run(ledger.status()))
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1  # each death once


def test_a_batch_restarting_after_an_unannounced_death_is_no_longer_in_flight():
    ledger = CrashLedger()
    asyncio.run(_start(ledger, ["a", "b"]))
    assert asyncio.run(ledger.status()).in_flight == 2
    asyncio.run(ledger.records(["a", "b"]))  # the batch runs again on the restarted actor
    assert asyncio.run(ledger.status()).in_flight == 0


def test_the_engine_hint_names_the_compile_only_where_vllm_compiles():
    compiled = load_config("embedded", ["engine.enforce_eager=false"])
    assert "compiles" in engine_start_hint(compiled) and "CPU" in engine_start_hint(compiled)
    assert engine_start_hint(load_config("embedded")) == ""  # the embedded default runs eager
    assert engine_start_hint(load_config("embedded", ["engine.backend=transformers"])) == ""


def test_the_heartbeat_beats_until_its_block_ends_and_survives_a_failing_beat():
    beats = []

    def beat():
        beats.append(time.monotonic())
        if len(beats) == 1:
            raise RuntimeError("the ledger did not answer")

    with Heartbeat(beat, every_s=0.01):
        while len(beats) < 3:
            time.sleep(0.005)
    count = len(beats)
    time.sleep(0.05)
    assert len(beats) == count  # stopped
    assert Heartbeat(beat).every_s == HEARTBEAT_S
    assert not any(t.name == "raypipe-progress" for t in threading.enumerate())


def test_a_step_with_nothing_to_count_says_what_it_waits_for(caplog):
    with caplog.at_level("INFO", logger="wait"), waiting("starting Ray", logging.getLogger("wait"), every_s=0.01):
        while not caplog.records:
            time.sleep(0.005)
    assert caplog.records[0].getMessage() == "starting Ray (0s)"


def test_the_generation_actor_tells_the_ledger_its_engine_start():
    ledger = CrashLedger()
    stage = probe.GenerateStage(
        load_config("embedded"), FakeRetriever(), engine_factory=_fake_engine, crash_ledger=ledger
    )
    status = asyncio.run(ledger.status())
    stage.close()
    assert (status.engines_starting, status.engines_ready) == (0, 1)
    assert status.last_start_s == stage.engine_start_s


def _fake_engine(config):
    from raypipe.testing.fakes import FakeEngine

    return FakeEngine(lambda request: "<answer> x </answer>")


def test_off_verbose_the_driver_does_not_relay_the_workers_and_logs_to_the_run(tmp_path, monkeypatch):
    calls = []

    class Stop(Exception):
        pass

    def init_ray(config, log_to_driver=True):
        calls.append(("init_ray", log_to_driver))
        raise Stop

    monkeypatch.setattr(probe, "init_ray", init_ray)
    monkeypatch.setattr(probe, "route_driver_logs", lambda path: calls.append(("route", path)))
    from raypipe.core.rundir import RunDir
    from raypipe.data.loaders import Question

    question = [Question(qid="q", dataset="toy", question="q?", golden_answers=["a"])]
    for relay, expected in (
        (False, [("route", tmp_path / "a" / "logs"), ("init_ray", False)]),
        (True, [("init_ray", True)]),
    ):
        calls.clear()
        run = RunDir(tmp_path / ("b" if relay else "a"))
        try:
            probe.run_probe(
                load_config("embedded"),
                run,
                question,
                retriever=FakeRetriever(),
                engine_factory=_fake_engine,
                relay_worker_logs=relay,
            )
        except Stop:
            pass
        assert calls == expected


def test_a_generation_actor_given_a_log_dir_keeps_its_process_output_off_the_terminal(tmp_path):
    script = textwrap.dedent(f"""
        import logging, os, subprocess, sys
        from raypipe.core.config import load_config
        from raypipe.runtime.generation import TrajectoryGenerator
        from raypipe.testing.fakes import FakeEngine, FakeRetriever

        def chatty_engine(config):
            print("INFO vllm chatter on stdout", flush=True)
            logging.getLogger("vllm").warning("WARNING vllm chatter")
            os.write(2, b"C library chatter on fd 2\\n")
            subprocess.run([sys.executable, "-c", "print('engine core process chatter')"], check=True)
            return FakeEngine(lambda request: "<answer> x </answer>")

        TrajectoryGenerator(load_config("embedded"), FakeRetriever(), engine_factory=chatty_engine,
                            log_dir={str(tmp_path / "logs")!r}).close()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "chatter" not in done.stderr
    (log_file,) = (tmp_path / "logs").glob("generation-pid*.log")
    text = log_file.read_text()
    for line in (
        "INFO vllm chatter on stdout",
        "WARNING vllm chatter",
        "C library chatter on fd 2",
        "engine core process chatter",
        "generation actor ready in",
    ):
        assert line in text


def test_a_failed_generation_shows_the_end_of_each_actor_log(tmp_path, caplog):
    (tmp_path / "generation-abc.log").write_text("".join(f"line {i}\n" for i in range(50)) + "the root cause\n")
    with caplog.at_level("ERROR", logger="gen"):
        show_actor_logs(tmp_path, lines=3, log=logging.getLogger("gen"))
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.endswith("line 48\nline 49\nthe root cause") and "generation-abc.log" in message


def test_setup_logging_keeps_other_libraries_info_off_the_terminal():
    script = textwrap.dedent("""
        import logging
        from raypipe.core.jobargs import setup_logging
        setup_logging(False)
        logging.getLogger("faiss.loader").info("faiss info")
        logging.getLogger("onnxruntime").warning("onnx warning")
        logging.getLogger("raypipe.stages.probe").info("raypipe info")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "raypipe info" in done.stderr and "onnx warning" in done.stderr
    assert "faiss info" not in done.stderr
    verbose = subprocess.run(
        [sys.executable, "-c", script.replace("setup_logging(False)", "setup_logging(True)")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "faiss info" in verbose.stderr


def test_the_driver_log_file_gets_everything_and_rays_info_leaves_the_terminal(tmp_path):
    root, ray_logger = logging.getLogger("calm.root"), logging.getLogger("calm.ray")
    console = io.StringIO()
    for logger in (root, ray_logger):
        logger.handlers.clear()
        logger.propagate = False
        logger.setLevel(logging.INFO)
    ray_logger.addHandler(logging.StreamHandler(console))
    path = route_driver_logs(tmp_path / "logs", logger=root, ray_logger=ray_logger)
    assert path == tmp_path / "logs" / DRIVER_LOG
    ray_logger.info("Started a local Ray instance.")
    ray_logger.warning("a worker died")
    ray_logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
    ray_logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    root.info("faiss loaded")
    assert (
        console.getvalue()
        == "a worker died\nToken authentication is disabled for this Ray cluster. Anyone with network access ...\n"
    )
    text = path.read_text()
    assert all(
        line in text
        for line in (
            "Started a local Ray instance.",
            "a worker died",
            "faiss loaded",
            "Token authentication is enabled",
        )
    )
    route_driver_logs(tmp_path / "logs", logger=root, ray_logger=ray_logger)  # a second run adds no second filter
    assert [type(f) for h in ray_logger.handlers for f in h.filters] == [NoActionNotices]
    for logger in (root, ray_logger):
        for handler in logger.handlers:
            handler.close()
        logger.handlers.clear()


def test_the_encoder_actors_count_passages_per_encoder_call():
    class FakeTally:
        def __init__(self):
            self.calls = []
            self.add = self

        def remote(self, n):
            self.calls.append(n)

    tally = FakeTally()
    encoder = BlockEncoder(EncoderSpec("hash:16"), call_rows=4, tally=tally)
    docs = pa.table({"id": [str(i) for i in range(10)], "title": ["t"] * 10, "text": ["x" * i for i in range(10)]})
    out = encoder(pa.table({"docs": [_ipc_bytes(docs)]}))
    assert tally.calls == [4, 4, 2]  # during the block, not once at its end
    plain = BlockEncoder(EncoderSpec("hash:16"), call_rows=4)(pa.table({"docs": [_ipc_bytes(docs)]}))
    assert out.column("embedding").equals(plain.column("embedding"))  # counting changes no vector


def test_a_local_rays_workers_keep_ray_trains_placement_group_cleaner_quiet():
    # a Ray started here has no dashboard, so no State API: the cleaner would warn once a second of every training
    script = textwrap.dedent("""
        import logging, ray
        from raypipe.core.config import load_config
        from raypipe.runtime.cluster import PG_CLEANER_LOGGER, init_ray

        init_ray(load_config("embedded", ["ray.num_cpus=1"]), log_to_driver=False)
        level = ray.get(ray.remote(lambda: logging.getLogger(PG_CLEANER_LOGGER).getEffectiveLevel()).remote())
        other = ray.get(ray.remote(lambda: logging.getLogger("raypipe.agenttrain").getEffectiveLevel()).remote())
        print(logging.getLevelName(level), logging.getLevelName(other))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cleaner, ours = done.stdout.split()
    assert cleaner == "ERROR" and ours != "ERROR"  # only the cleaner's warnings go; raypipe's own lines stay

"""`raypipe serve-agent` on Ray Serve: the HTTP contract, refusals, streaming, the OpenAI route, backpressure, the
deadline, a second application with a token stopped by its event (fake engine and retriever, one module-wide
application); and, slow, the command itself on the embedded engine: the probe job's answers, then SIGINT."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from raypipe.cli import usage
from raypipe.core.config import load_config
from raypipe.llm.base import Generation, GenerationRequest
from raypipe.testing.fakes import FakeEngine, FakeRetriever

ROOT = Path(__file__).resolve().parents[1]
SLOW_S, STALL_S = 0.5, 30.0  # seconds per engine request of a question with 'slow' / 'stall' in it


def test_cli_lists_serve_agent():
    assert "serve-agent" in usage()
    proc = subprocess.run(
        [sys.executable, "-m", "raypipe", "serve-agent", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    for flag in ("--port", "--host", "--token", "--controller", "--stoprag", "--log-run", "POST /v1/answer"):
        assert flag in proc.stdout, flag


MODEL_PATH = "/srv/raypipe-test/models/secret-model"  # where the fake engine says it loaded from (never shown)
SECRET_ERROR = f'cannot read {MODEL_PATH}/weights.bin\nTraceback (most recent call last):\n  File "/srv/engine.py"'


class PacedEngine(FakeEngine):
    """Each question searches twice, then answers 'final'; probe i answers 'probe i'. A question with 'slow' in it
    takes SLOW_S per request, one with 'stall' STALL_S; one with 'explode' fails with a path and a traceback."""

    def __init__(self):
        super().__init__(self.reply)

    def describe(self) -> dict:
        from raypipe.llm.common import engine_record

        return engine_record(self, CONFIG.engine, Path(MODEL_PATH))

    @staticmethod
    def reply(request: GenerationRequest) -> str:
        if "explode" in request.prompt:
            raise RuntimeError(SECRET_ERROR)
        done = request.prompt.count("Doc 1(")
        if request.prompt.endswith("<answer>"):
            return f" probe {done} </answer>"
        return (
            "<think> done </think>\n<answer> final </answer>"
            if done >= 2
            else f"<think> look </think>\n<search> query {done} </search>"
        )

    async def generate(self, request: GenerationRequest) -> Generation:
        for word, seconds in (("slow", SLOW_S), ("stall", STALL_S)):
            if word in request.prompt:
                await asyncio.sleep(seconds)
        return await super().generate(request)


def paced_engine(_config) -> PacedEngine:
    return PacedEngine()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = load_config(
    "embedded",
    [
        "serve_agent.max_in_flight=2",
        "serve_agent.max_body_bytes=2048",
        "serve_agent.num_cpus=0",
        "serve_agent.timeout_s=8",
        "serve_agent.deployment=raypipe-test-agent",
    ],
)


@pytest.fixture(scope="module")
def service(ray_local):
    """The application on the module's local Ray, with the paced engine and a fake retriever."""
    from raypipe.runtime.serve_agent import deploy_agent, undeploy_agent

    yield deploy_agent(CONFIG, FakeRetriever(), port=free_port(), engine_factory=paced_engine)
    undeploy_agent(CONFIG)


def call(url: str, data: dict | bytes | None = None, token: str | None = None) -> tuple[int, str]:
    """(status, body text) of one request; a JSON body unless ``data`` is bytes."""
    raw = data if isinstance(data, bytes) or data is None else json.dumps(data).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=raw, headers=headers), timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def events(text: str) -> list[tuple[str | None, object]]:
    """(event name, data) of each server-sent event."""
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        data = fields["data"]
        out.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return out


def test_health_readiness_and_models(service):
    status, text = call(f"{service}/health")
    health = json.loads(text)
    assert status == 200 and health["status"] == "ok" and health["policies"] == ["natural", "cap"]
    assert health["protocol"] == "search_r1" and health["max_turns"] == 4 and health["documents_read"] == 3
    assert health["limits"]["max_in_flight"] == 2 and health["token"] is False and health["in_flight"] == 0
    status, text = call(f"{service}/ready")
    assert (status, json.loads(text)) == (200, {"ready": True, "in_flight": 0})
    assert json.loads(call(f"{service}/v1/models")[1])["data"][0]["id"] == "raypipe-agent"


def test_an_answer_and_the_stop_reason_a_policy_gives(service):
    status, text = call(f"{service}/v1/answer", {"question": "Who directed Ed Wood?"})
    natural = json.loads(text)
    assert status == 200 and (natural["answer"], natural["stop_reason"], natural["iterations"]) == (
        "final",
        "answer",
        2,
    )
    assert natural["cost"]["generated_tokens"] > 0 and natural["f1"] is None and "trajectory" not in natural
    status, text = call(
        f"{service}/v1/answer",
        {
            "question": "Who directed Ed Wood?",
            "policy": {"name": "cap", "k": 1},
            "return_trajectory": True,
            "golden_answers": ["probe 1"],
        },
    )
    capped = json.loads(text)
    assert status == 200 and (capped["answer"], capped["stop_reason"], capped["iterations"]) == (
        "probe 1",
        "controller",
        1,
    )
    assert capped["iterations_left"] == 3 and capped["f1"] == 1.0 and capped["policy"] == "cap1"
    assert [r["probe_answer"] for r in capped["trajectory"]["iterations"]] == ["probe 0", "probe 1"]


@pytest.mark.parametrize(
    "data, status, words",
    [
        ({"question": " "}, 422, "question is empty"),
        ({"question": "q", "policy": "oracle"}, 400, "unknown policy"),
        ({"question": "q", "policy": "heuristic"}, 400, "--controller BUNDLE"),
        ({"question": "q", "policy": "stoprag"}, 400, "--stoprag PATH"),
        ({"question": "q", "policy": "cap"}, 422, "needs k"),
        ({"question": "x" * 3000}, 413, "serve_agent.max_body_bytes"),
        (b"{not json", 400, "not JSON"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_one_line_detail(service, data, status, words):
    got, text = call(f"{service}/v1/answer", data)
    detail = json.loads(text)["detail"]
    assert got == status and isinstance(detail, str) and "\n" not in detail and words in detail, (got, detail)
    refused_stream = call(f"{service}/v1/answer", {**data, "stream": True}) if isinstance(data, dict) else (status, "")
    assert refused_stream[0] == status  # refused before a stream starts, not as a 200 stream


def test_the_trajectory_streams_as_server_sent_events(service):
    status, text = call(f"{service}/v1/answer", {"question": "Who?", "stream": True, "return_trajectory": True})
    got = events(text)
    assert status == 200 and [name for name, _ in got] == ["iteration", "iteration", "iteration", "answer"]
    assert [data["iteration"] for _, data in got[:3]] == [0, 1, 2] and got[1][1]["query"] == "query 0"
    assert got[1][1]["doc_ids"] == ["query 0-0", "query 0-1", "query 0-2"] and got[1][1]["probe_f1"] is None
    assert got[-1][1]["answer"] == "final" and len(got[-1][1]["trajectory"]["iterations"]) == 3


def test_the_openai_route(service):
    request = {"model": "x", "messages": [{"role": "user", "content": "Who?"}], "policy": {"name": "cap", "k": 0}}
    status, text = call(f"{service}/v1/chat/completions", request)
    reply = json.loads(text)
    assert status == 200 and reply["object"] == "chat.completion" and reply["model"] == "raypipe-agent"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "probe 0"}
    assert reply["raypipe"]["stop_reason"] == "controller" and len(reply["raypipe"]["trajectory"]["iterations"]) == 1
    assert reply["usage"]["completion_tokens"] == reply["raypipe"]["cost"]["generated_tokens"]
    status, text = call(f"{service}/v1/chat/completions", {**request, "stream": True})
    chunks = events(text)
    assert status == 200 and chunks[-1] == (None, "[DONE]")
    assert "".join(c["choices"][0]["delta"].get("content", "") for _, c in chunks[:-1]) == "probe 0"
    assert call(f"{service}/v1/chat/completions", {"messages": []})[0] == 422


def test_past_the_bound_requests_are_refused_and_none_is_lost_or_answered_twice(service):
    before = json.loads(call(f"{service}/health")[1])["counts"]
    n = 6
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: call(f"{service}/v1/answer", {"question": f"slow question {i}?"}), range(n)))
    answered = [json.loads(text) for status, text in results if status == 200]
    refused = [json.loads(text)["detail"] for status, text in results if status == 429]
    assert len(answered) + len(refused) == n, results  # each request: one answer or one refusal
    assert 1 <= len(answered) <= 2 and refused, results
    assert all("serve_agent.max_in_flight" in d for d in refused)
    assert len({a["qid"] for a in answered}) == len(answered) and all(a["answer"] == "final" for a in answered)
    after = json.loads(call(f"{service}/health")[1])
    assert after["in_flight"] == 0 and call(f"{service}/ready")[0] == 200
    assert after["counts"]["answered"] - before.get("answered", 0) == len(answered)
    assert after["counts"]["rejected"] - before.get("rejected", 0) == len(refused)


def test_a_question_past_the_deadline_gets_408_and_frees_its_slot(service):
    """The deadline counts from the request's arrival at Serve's proxy (its queue included): the proxy's 408."""
    started = time.monotonic()
    status, text = call(f"{service}/v1/answer", {"question": "a stall question"})
    assert status == 408 and "timed out after 8" in text
    assert time.monotonic() - started < STALL_S
    deadline = time.monotonic() + 2
    while json.loads(call(f"{service}/health")[1])["in_flight"] != 0:  # the proxy cancelled it on the replica
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_the_deadlines_count_from_arrival_at_serve_s_proxy(monkeypatch):
    """Both commands start Serve's proxy with their deadline as its end-to-end request timeout, which counts from a
    request's arrival, Serve's queue included (a replica's own clock starts only when it takes the request)."""
    import raypipe.runtime.serve as serve_module
    import raypipe.runtime.serve_agent as agent_module

    started: list[dict] = []
    monkeypatch.setattr(serve_module.serve, "start", lambda http_options: started.append(http_options))
    monkeypatch.setattr(serve_module.serve, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(agent_module.serve, "run_many", lambda *args, **kwargs: None)
    monkeypatch.setattr(agent_module, "wait_running", lambda *args: None)
    monkeypatch.setattr(serve_module, "retrieval_app", lambda *args: None)
    agent_module.deploy_agent(CONFIG, FakeRetriever(), port=8123, engine_factory=paced_engine)
    config = load_config("embedded", ["retrieval.serve.timeout_s=7"])
    serve_module.deploy_retrieval(config, "unused", port=8124)
    assert [(o["port"], o["request_timeout_s"]) for o in started] == [(8123, 8.0), (8124, 7.0)]


def test_a_second_application_with_a_token_stops_when_told(service):
    """serve_until_stopped (the command's body) beside the first application: its own route prefix and token."""
    from ray import serve

    from raypipe.stages.serve_agent import serve_until_stopped

    config = load_config(
        "embedded",
        ["serve_agent.deployment=raypipe-test-agent-2", "serve_agent.route_prefix=/second", "serve_agent.num_cpus=0"],
    )
    port = int(service.rsplit(":", 1)[1])
    stop = threading.Event()
    job = threading.Thread(
        target=serve_until_stopped,
        args=(config, "127.0.0.1", port, stop, "s3cret"),
        kwargs={"engine_factory": paced_engine, "retriever": FakeRetriever()},
    )
    job.start()
    try:
        url = f"{service}/second"
        deadline = time.monotonic() + 120
        while call(f"{url}/health", token="s3cret")[0] != 200:
            assert time.monotonic() < deadline and job.is_alive(), "the second application never came up"
            time.sleep(1)
        assert call(f"{url}/v1/answer", {"question": "Who?"})[0] == 401
        status, text = call(f"{url}/v1/answer", {"question": "Who?"}, token="s3cret")
        assert status == 200 and json.loads(text)["answer"] == "final"
    finally:
        stop.set()
        job.join(timeout=120)
    assert not job.is_alive()
    assert "raypipe-test-agent-2" not in serve.status().applications
    assert call(f"{service}/health")[0] == 200  # the first one serves on


def assert_private(text: str, *paths: str) -> None:
    """Nothing of the replica's machine in a reply: no file path, no traceback."""
    for secret in (MODEL_PATH, "/srv/", "Traceback", 'File "', "site-packages", str(ROOT), *paths):
        assert secret not in text, (secret, text[:500])


def test_no_route_shows_a_local_path_or_a_traceback(service, tmp_path):
    """Every route sent a request that fails: the engine failing with a path and a traceback in its message (a 200
    whose error is cleaned), and, on an application whose request log cannot be written (an OSError naming the log's
    path), each answer route streamed and not: a 500 or an error event saying only that the replica failed."""
    from raypipe.runtime.serve_agent import INTERNAL_ERROR, deploy_agent, undeploy_agent

    status, text = call(f"{service}/v1/answer", {"question": "explode please"})
    assert (
        status == 200
        and json.loads(text)["stop_reason"] == "internal_error"
        and "<hidden>" in json.loads(text)["error"]
    )
    assert_private(text)
    for route in ("health", "ready", "v1/models"):
        assert_private(call(f"{service}/{route}")[1])

    log_run = tmp_path / "log"
    config = load_config(
        "embedded",
        ["serve_agent.num_cpus=0", "serve_agent.deployment=raypipe-test-agent-log", "serve_agent.route_prefix=/log"],
    )
    url = deploy_agent(
        config, FakeRetriever(), port=int(service.rsplit(":", 1)[1]), engine_factory=paced_engine, log_run=str(log_run)
    )
    try:
        (log_run / "iterations").mkdir(parents=True, exist_ok=True)
        (log_run / "iterations").rmdir()
        (log_run / "iterations").write_text("not a folder")  # every write of the log fails, naming its path
        question = {"question": "Who?"}
        chat = {"messages": [{"role": "user", "content": "Who?"}]}
        for route, body in (("v1/answer", question), ("v1/chat/completions", chat)):
            status, text = call(f"{url}/{route}", body)
            assert status == 500 and json.loads(text) == {"detail": INTERNAL_ERROR}
            status, text = call(f"{url}/{route}", {**body, "stream": True})
            assert status == 200 and INTERNAL_ERROR in text, (route, status, text)
            assert_private(text, str(tmp_path))
        for route, body in (("health", None), ("ready", None), ("v1/models", None), ("v1/answer", b"{not json")):
            assert_private(call(f"{url}/{route}", body)[1], str(tmp_path))
        assert json.loads(call(f"{url}/health")[1])["request_log"] is True
    finally:
        undeploy_agent(config)


def test_a_stream_whose_client_leaves_before_its_body_starts_is_cancelled(service):
    """The route's own response, called as an ASGI server (spec 2.4) calls it for a client already gone: sending
    the response's start fails, so the events' generator never starts, yet the trajectory (30 s per engine
    request) is cancelled and its slot freed at once."""
    from starlette.requests import ClientDisconnect, Request

    from raypipe.runtime.answering import Admission, AgentAnswerer, PolicyBook
    from raypipe.runtime.serve_agent import AgentDeployment, ServiceMetrics

    async def scenario() -> tuple[int, int]:
        replica = object.__new__(AgentDeployment.func_or_class.__bases__[0])  # the class under Serve's wrapper
        replica.config, replica.limits, replica.token = CONFIG, CONFIG.serve_agent, None
        replica.answerer = await AgentAnswerer.start(CONFIG, FakeRetriever(), PolicyBook(CONFIG.stopping), paced_engine)
        replica.admission, replica.metrics = Admission(2), ServiceMetrics()
        body = json.dumps({"question": "a stall question", "stream": True}).encode()

        async def receive_body() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def gone() -> dict:
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            raise OSError("the client went away")  # what an ASGI server's send does for a closed connection

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/answer",
            "headers": [],
            "asgi": {"version": "3.0", "spec_version": "2.4"},
        }
        response = await replica.answer(Request(scope, receive_body))
        admitted = replica.admission.in_flight
        with pytest.raises(ClientDisconnect):
            await response(scope, gone, send)
        await asyncio.sleep(0.1)
        return admitted, replica.admission.in_flight

    admitted, after = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert (admitted, after) == (1, 0)


def test_a_stream_whose_client_hangs_up_is_cancelled_on_the_server(service):
    """Over HTTP: the client sends a streamed question and hangs up at once: its trajectory (30 s per engine
    request) is cancelled and its slot freed, long before the deadline (8 s) would."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(service)
    body = json.dumps({"question": "a stall question", "stream": True}).encode()
    for _ in range(3):
        with socket.create_connection((parts.hostname, parts.port)) as sock:
            sock.sendall(
                b"POST /v1/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        time.sleep(0.5)
    deadline = time.monotonic() + 4
    while (in_flight := json.loads(call(f"{service}/health")[1])["in_flight"]) != 0:
        assert time.monotonic() < deadline, f"{in_flight} trajectories of clients that left still run"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> list[str]:
    """Settings of a 40-passage index of the bundled corpus, built in-process (seconds)."""
    from raypipe.data.loaders import BUNDLED_CORPUS
    from raypipe.runtime.index_build import ensure_index

    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(40)))
    settings = [
        f"data.corpus={corpus}",
        f"retrieval.index.dir={tmp_path_factory.mktemp('idx') / 'tiny'}",
        "retrieval.actors.num_cpus=0",
        "serve_agent.num_cpus=0",
    ]
    ensure_index(load_config("embedded", settings), use_ray=False)
    return settings


def retrieval_actors() -> int:
    """Live retrieval replicas on the module's Ray (from the GCS: the test Ray runs no dashboard)."""
    from ray._private.state import actors

    return sum(a["ActorClassName"] == "RetrievalActor" and a["State"] == "ALIVE" for a in actors().values())


def test_agent_replicas_share_one_retrieval_service(service, indexed):
    """retrieval.backend: actors with two agent replicas: the command starts the retrieval replicas once and every
    agent replica searches through them (before: each agent replica started its own)."""
    from raypipe.stages.serve_agent import serve_until_stopped

    config = load_config(
        "embedded",
        [
            *indexed,
            "serve_agent.replicas=2",
            "retrieval.actors.replicas=1",
            "serve_agent.deployment=raypipe-test-agent-shared",
            "serve_agent.route_prefix=/shared",
        ],
    )
    before = retrieval_actors()
    port = int(service.rsplit(":", 1)[1])
    stop = threading.Event()
    job = threading.Thread(
        target=serve_until_stopped, args=(config, "127.0.0.1", port, stop), kwargs={"engine_factory": paced_engine}
    )
    job.start()
    try:
        url = f"{service}/shared"
        deadline = time.monotonic() + 180
        while call(f"{url}/health")[0] != 200:
            assert time.monotonic() < deadline and job.is_alive(), "the application never came up"
            time.sleep(1)
        from ray import serve

        while serve.status().applications["raypipe-test-agent-shared"].status != "RUNNING":
            assert time.monotonic() < deadline, "the two replicas never ran"
            time.sleep(0.5)
        replicas: set[str] = set()
        for i in range(40):  # Serve routes each call on its own: ask until both replicas have named themselves
            status, text = call(f"{url}/v1/answer", {"question": f"Who is Ed Wood? {i}", "return_trajectory": True})
            assert status == 200, text
            assert json.loads(text)["trajectory"]["iterations"][1]["doc_ids"]  # searched the index
            replicas.add(json.loads(call(f"{url}/health")[1])["replica"])
            if len(replicas) == 2:
                break
        assert len(replicas) == 2  # both replicas served
        assert retrieval_actors() - before == 1  # one retrieval replica for both agent replicas
    finally:
        stop.set()
        job.join(timeout=120)
    assert not job.is_alive()
    assert retrieval_actors() == before  # stopped with the application


def test_retrieval_that_never_becomes_ready_fails_within_the_bound(ray_local, indexed):
    """A retrieval replica asking for a resource no node has: a clear error after retrieval.start_timeout_s, the
    replicas stopped (before: ray.get waited forever)."""
    from raypipe.retrieval import index_dir_for
    from raypipe.runtime.retrieval import RetrievalStartError, start_retrieval_service

    config = load_config(
        "embedded", [*indexed, "retrieval.actors.resources={raypipe_nowhere: 1}", "retrieval.start_timeout_s=2"]
    )
    before = retrieval_actors()
    started = time.monotonic()
    with pytest.raises(RetrievalStartError) as failed:
        start_retrieval_service(config, index_dir_for(config))
    assert time.monotonic() - started < 30
    message = str(failed.value)
    assert "not ready within 2 s (retrieval.start_timeout_s)" in message and "raypipe_nowhere" in message
    assert "\n" not in message
    deadline = time.monotonic() + 30
    while retrieval_actors() > before:
        assert time.monotonic() < deadline, "the replicas that never started were not stopped"
        time.sleep(0.5)


def test_agent_replicas_that_cannot_be_placed_fail_within_the_bound(service):
    from raypipe.runtime.serve_agent import AgentStartError, deploy_agent, undeploy_agent

    config = load_config(
        "embedded",
        [
            "serve_agent.resources={raypipe_generation: 1}",
            "serve_agent.num_cpus=0",
            "serve_agent.start_timeout_s=3",
            "serve_agent.deployment=raypipe-test-unplaced",
            "serve_agent.route_prefix=/unplaced",
        ],
    )
    started = time.monotonic()
    try:
        with pytest.raises(AgentStartError) as failed:
            deploy_agent(config, FakeRetriever(), port=int(service.rsplit(":", 1)[1]), engine_factory=paced_engine)
    finally:
        undeploy_agent(config)
    assert time.monotonic() - started < 60
    assert "within 3 s (serve_agent.start_timeout_s)" in str(failed.value) and "raypipe_generation" in str(failed.value)


@pytest.mark.slow
def test_the_command_answers_as_the_probe_job_then_stops_on_sigint(paragraph_corpus, tmp_path):
    """The embedded engine (greedy), one request at a time: the service's answers and transcripts equal the probe
    job's generation body's for the same questions and settings; then SIGINT stops the command cleanly."""
    from raypipe.data.loaders import load_questions
    from raypipe.retrieval import LocalRetriever, encoder_spec, search_params
    from raypipe.runtime.generation import TrajectoryGenerator
    from raypipe.runtime.index_build import ensure_index

    corpus = paragraph_corpus(("hotpotqa",), 2)
    settings = [
        "agent.max_turns=2",
        "agent.max_new_tokens=96",
        "agent.enforce_think_chars=150",
        "ray.num_cpus=2",
        f"data.corpus={corpus}",
        "serve_agent.num_cpus=0",
    ]
    questions = load_questions("hotpotqa", limit=2)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raypipe",
            "serve-agent",
            "--port",
            str(port),
            "--log-run",
            str(tmp_path / "log"),
            *(a for s in settings for a in ("--set", s)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if "agent service ready at" in line:
                break
        assert f"ready at http://127.0.0.1:{port}" in "".join(lines), "".join(lines[-40:])
        served = []
        for q in questions:
            status, text = call(
                f"http://127.0.0.1:{port}/v1/answer",
                {
                    "question": q.question,
                    "golden_answers": q.golden_answers,
                    "dataset": q.dataset,
                    "return_trajectory": True,
                },
            )
            assert status == 200, text
            served.append(json.loads(text))
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "agent service stopped" in out

    config = load_config("embedded", settings)
    retriever = LocalRetriever.open(
        ensure_index(config, use_ray=False), encoder_spec(config.retrieval), search_params(config.retrieval)
    )
    probe = TrajectoryGenerator(config, retriever)
    try:
        expected = [probe.run([q])[0] for q in questions]  # one at a time, as the requests were
    finally:
        probe.close()
    for mine, theirs in zip(served, expected):
        trajectory = theirs.trajectory
        assert mine["trajectory"]["transcript"] == trajectory["transcript"]
        assert (mine["answer"], mine["stop_reason"], mine["iterations"]) == (
            trajectory["final_answer"],
            trajectory["stop_reason"],
            trajectory["n_iterations"],
        )
        assert [r["probe_answer"] for r in mine["trajectory"]["iterations"]] == [
            r["probe_answer"] for r in theirs.iterations
        ]
        assert mine["f1"] == pytest.approx(trajectory["final_f1"])
    from raypipe.core.rundir import RunDir

    logged = RunDir(tmp_path / "log").read("trajectories").to_pylist()
    assert sorted(t["transcript"] for t in logged) == sorted(s["trajectory"]["transcript"] for s in served)

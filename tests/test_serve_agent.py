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
    proc = subprocess.run([sys.executable, "-m", "raypipe", "serve-agent", "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for flag in ("--port", "--host", "--token", "--controller", "--stoprag", "--log-run", "POST /v1/answer"):
        assert flag in proc.stdout, flag


class PacedEngine(FakeEngine):
    """Each question searches twice, then answers 'final'; probe i answers 'probe i'. A question with 'slow' in it
    takes SLOW_S per request, one with 'stall' STALL_S."""

    def __init__(self):
        super().__init__(self.reply)

    @staticmethod
    def reply(request: GenerationRequest) -> str:
        done = request.prompt.count("Doc 1(")
        if request.prompt.endswith("<answer>"):
            return f" probe {done} </answer>"
        return "<think> done </think>\n<answer> final </answer>" if done >= 2 else f"<think> look </think>\n<search> query {done} </search>"

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


CONFIG = load_config("embedded", ["serve_agent.max_in_flight=2", "serve_agent.max_body_bytes=2048",
                                  "serve_agent.num_cpus=0", "serve_agent.timeout_s=8",
                                  "serve_agent.deployment=raypipe-test-agent"])  # fmt: skip


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
    assert status == 200 and (natural["answer"], natural["stop_reason"], natural["iterations"]) == ("final", "answer", 2)
    assert natural["cost"]["generated_tokens"] > 0 and natural["f1"] is None and "trajectory" not in natural
    status, text = call(f"{service}/v1/answer", {"question": "Who directed Ed Wood?", "policy": {"name": "cap", "k": 1},
                                                  "return_trajectory": True, "golden_answers": ["probe 1"]})  # fmt: skip
    capped = json.loads(text)
    assert status == 200 and (capped["answer"], capped["stop_reason"], capped["iterations"]) == ("probe 1", "controller", 1)
    assert capped["iterations_saved"] == 3 and capped["f1"] == 1.0 and capped["policy"] == "cap1"
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
    started = time.monotonic()
    status, text = call(f"{service}/v1/answer", {"question": "a stall question"})
    assert status == 408 and "serve_agent.timeout_s" in json.loads(text)["detail"]
    assert time.monotonic() - started < STALL_S
    assert json.loads(call(f"{service}/health")[1])["in_flight"] == 0


def test_a_second_application_with_a_token_stops_when_told(service):
    """serve_until_stopped (the command's body) beside the first application: its own route prefix and token."""
    from ray import serve

    from raypipe.stages.serve_agent import serve_until_stopped

    config = load_config("embedded", ["serve_agent.deployment=raypipe-test-agent-2", "serve_agent.route_prefix=/second",
                                      "serve_agent.num_cpus=0"])  # fmt: skip
    port = int(service.rsplit(":", 1)[1])
    stop = threading.Event()
    job = threading.Thread(target=serve_until_stopped, args=(config, "127.0.0.1", port, stop, "s3cret"),
                           kwargs={"engine_factory": paced_engine, "retriever": FakeRetriever()})  # fmt: skip
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


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> list[str]:
    """Settings of a 40-passage index of the bundled corpus, built in-process (seconds)."""
    from raypipe.data.loaders import BUNDLED_CORPUS
    from raypipe.stages.index import ensure_index

    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(40)))
    settings = [f"data.corpus={corpus}", f"retrieval.index_dir={tmp_path_factory.mktemp('idx') / 'tiny'}",
                "retrieval.num_cpus=0", "serve_agent.num_cpus=0"]  # fmt: skip
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

    config = load_config("embedded", [*indexed, "serve_agent.replicas=2", "retrieval.replicas=1",
                                      "serve_agent.deployment=raypipe-test-agent-shared",
                                      "serve_agent.route_prefix=/shared"])  # fmt: skip
    before = retrieval_actors()
    port = int(service.rsplit(":", 1)[1])
    stop = threading.Event()
    job = threading.Thread(target=serve_until_stopped, args=(config, "127.0.0.1", port, stop),
                           kwargs={"engine_factory": paced_engine})  # fmt: skip
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
        replicas = set()
        for i in range(8):
            status, text = call(f"{url}/v1/answer", {"question": f"Who is Ed Wood? {i}", "return_trajectory": True})
            assert status == 200, text
            assert json.loads(text)["trajectory"]["iterations"][1]["doc_ids"]  # searched the index
            replicas.add(json.loads(call(f"{url}/health")[1])["replica"])
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

    config = load_config("embedded", [*indexed, "retrieval.resources={raypipe_nowhere: 1}",
                                      "retrieval.start_timeout_s=2"])  # fmt: skip
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

    config = load_config("embedded", ["serve_agent.resources={raypipe_generation: 1}", "serve_agent.num_cpus=0",
                                      "serve_agent.start_timeout_s=3", "serve_agent.deployment=raypipe-test-unplaced",
                                      "serve_agent.route_prefix=/unplaced"])  # fmt: skip
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
    from raypipe.stages.index import ensure_index

    corpus = paragraph_corpus(("hotpotqa",), 2)
    settings = ["agent.max_turns=2", "agent.max_new_tokens=96", "agent.enforce_think_chars=150", "ray.num_cpus=2",
                f"data.corpus={corpus}", "serve_agent.num_cpus=0"]  # fmt: skip
    questions = load_questions("hotpotqa", limit=2)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "raypipe", "serve-agent", "--port", str(port),
                             "--log-run", str(tmp_path / "log"), *(a for s in settings for a in ("--set", s))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
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
            status, text = call(f"http://127.0.0.1:{port}/v1/answer",
                                {"question": q.question, "golden_answers": q.golden_answers, "dataset": q.dataset,
                                 "return_trajectory": True})  # fmt: skip
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
    retriever = LocalRetriever.open(ensure_index(config, use_ray=False), encoder_spec(config.retrieval),
                                    search_params(config.retrieval))  # fmt: skip
    probe = TrajectoryGenerator(config, retriever)
    try:
        expected = [probe.run([q])[0] for q in questions]  # one at a time, as the requests were
    finally:
        probe.close()
    for mine, theirs in zip(served, expected):
        trajectory = theirs.trajectory
        assert mine["trajectory"]["transcript"] == trajectory["transcript"]
        assert (mine["answer"], mine["stop_reason"], mine["iterations"]) == (
            trajectory["final_answer"], trajectory["stop_reason"], trajectory["n_iterations"])
        assert [r["probe_answer"] for r in mine["trajectory"]["iterations"]] == [r["probe_answer"] for r in theirs.iterations]
        assert mine["f1"] == pytest.approx(trajectory["final_f1"])
    from raypipe.core.rundir import RunDir

    logged = RunDir(tmp_path / "log").read("trajectories").to_pylist()
    assert sorted(t["transcript"] for t in logged) == sorted(s["trajectory"]["transcript"] for s in served)

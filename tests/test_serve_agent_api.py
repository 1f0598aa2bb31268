"""`raypipe serve-agent` without Ray: the request contract and every refusal, the policies, the replica's body on
fakes (answers, stop reasons, streamed rows, per-request predictions, the request log), the in-flight bound.
The Serve application itself: tests/test_serve_agent.py."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from raypipe.agents.answer_api import (
    AnswerRequest,
    ApiError,
    Policy,
    answer_body,
    chat_body,
    chat_chunks,
    parse_answer_request,
    parse_chat_request,
    sse,
)
from raypipe.agents.probe_run import check_resumable
from raypipe.core.config import ConfigError, load_config
from raypipe.core.rundir import RunDir
from raypipe.core.schema import ITERATIONS, STOP_ANSWER, STOP_CONTROLLER, TRAJECTORIES
from raypipe.runtime.answering import Admission, AgentAnswerer, PolicyBook, within_deadline
from raypipe.stopping.batching import OneByOne
from raypipe.stopping.cap_online import CapController
from raypipe.stopping.policies import check_policy
from raypipe.testing.fakes import FakeEngine, FakeRetriever

CONFIG = load_config("embedded", ["serve_agent.max_question_chars=200", "serve_agent.max_turns_limit=6"])
LIMITS = CONFIG.serve_agent


def body(data) -> bytes:
    return json.dumps(data).encode()


def parsed(raw: bytes, parse=parse_answer_request) -> AnswerRequest:
    """What the service does with a body: parse it, then check its policy against the registry."""
    request = parse(raw, LIMITS)
    request = request[1] if isinstance(request, tuple) else request
    check_policy(request.policy)
    return request


def refused(data, parse=parse_answer_request) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parsed(data if isinstance(data, bytes) else body(data), parse)
    assert "\n" not in caught.value.detail
    return caught.value


def test_a_request_needs_only_a_question():
    request = parse_answer_request(body({"question": "  Who directed Ed Wood? "}), LIMITS)
    assert request.question == "Who directed Ed Wood?"
    assert (request.policy.name, request.max_turns, request.return_trajectory, request.stream) == (
        "natural",
        None,
        False,
        False,
    )
    assert not request.scored
    shorthand = parse_answer_request(body({"question": "q", "policy": "natural", "max_turns": 6}), LIMITS)
    assert shorthand.policy.name == "natural" and shorthand.max_turns == 6
    full = parse_answer_request(
        body(
            {
                "question": "q",
                "policy": {"name": "heuristic", "theta_p": 0.4, "theta_u": 0.1, "variant": "give_up"},
                "golden_answers": ["x"],
            }
        ),
        LIMITS,
    )
    assert full.policy.theta_p == 0.4 and full.policy.variant == "give_up" and full.scored


@pytest.mark.parametrize(
    "data, status, words",
    [
        ({"question": "   "}, 422, "question is empty"),
        ({"question": ""}, 422, "question is empty"),
        ({}, 422, "question"),
        ({"question": "x" * 201}, 422, "serve_agent.max_question_chars"),
        ({"question": "q", "policy": {"name": "oracle"}}, 400, "unknown policy 'oracle'"),
        ({"question": "q", "policy": "oracle"}, 400, "natural, heuristic, cap, stoprag"),
        ({"question": "q", "policy": "cap"}, 422, "policy cap needs k"),
        ({"question": "q", "policy": {"name": "cap", "k": -1}}, 422, "policy.k"),
        ({"question": "q", "policy": {"name": "cap", "k": 1, "theta_p": 0.3}}, 422, "policy cap takes no theta_p"),
        ({"question": "q", "policy": {"name": "natural", "k": 1}}, 422, "policy natural takes no k"),
        ({"question": "q", "policy": {"name": "heuristic", "preset": "bold"}}, 422, "unknown preset 'bold'"),
        ({"question": "q", "policy": {"name": "heuristic", "variant": "x"}}, 422, "unknown variant 'x'"),
        ({"question": "q", "policy": {"name": "heuristic", "theta_p": "high"}}, 422, "policy.theta_p"),
        ({"question": "q", "max_turns": 7}, 422, "serve_agent.max_turns_limit"),
        ({"question": "q", "max_turns": 0}, 422, "max_turns"),
        ({"question": "q", "golden_answers": [" "]}, 422, "golden_answers is empty"),
        ({"question": "q", "temperature": 1.0}, 422, "temperature: unknown field"),
        ({"question": ["a", "b"]}, 422, "question"),
        ([{"question": "q"}], 422, "JSON object"),
        (b'{"question": "unclosed', 400, "not JSON"),
        (b"", 422, "JSON object"),
    ],
)
def test_every_bad_request_is_a_4xx_with_a_one_line_message(data, status, words):
    error = refused(data)
    assert error.status == status and words in error.detail, error.detail


def test_a_chat_request_asks_its_last_user_message():
    chat, request = parse_chat_request(
        body(
            {
                "model": "anything",
                "temperature": 0.7,
                "max_tokens": 5,  # OpenAI's sampling fields: ignored
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "first?"},
                    {"role": "assistant", "content": "hm"},
                    {"role": "user", "content": [{"type": "text", "text": "Who is "}, {"type": "text", "text": "Ed?"}]},
                ],
                "policy": {"name": "cap", "k": 0},
            }
        ),
        LIMITS,
    )
    assert request.question == "Who is Ed?" and request.return_trajectory and request.policy.k == 0
    assert not chat.stream
    assert refused({"messages": [{"role": "system", "content": "x"}]}, parse_chat_request).status == 422
    assert "question is empty" in refused({"messages": [{"role": "user", "content": " "}]}, parse_chat_request).detail
    assert refused({"messages": "hi"}, parse_chat_request).status == 422


def test_cap_stops_after_retrieval_iteration_k():
    cap = CapController(2)
    decide = lambda i: asyncio.run(cap.decide("q", [{"iteration": j} for j in range(i + 1)]))  # noqa: E731
    assert [decide(i).stop for i in range(4)] == [False, False, True, True]
    assert decide(2).answer_iteration is None and decide(2).reason == "cap2"
    assert asyncio.run(CapController(0).decide("q", [{"iteration": 0}])).stop
    with pytest.raises(ValueError):
        CapController(-1)


class StepPredictor(OneByOne):
    """P̂ = 0.1 x iteration, Û = 0.05; records the questions and iterations it was asked about."""

    def __init__(self):
        self.asked: list[tuple[str, int]] = []

    def predict(self, history_rows, question):
        iteration = history_rows[-1]["iteration"]
        self.asked.append((question, iteration))
        return 0.1 * iteration, 0.05


def test_policies_refuse_what_the_server_has_not_loaded():
    bare = PolicyBook(CONFIG.stopping)
    assert bare.offered() == ["natural", "cap"]
    assert bare.controller(Policy())[0] is None
    controller, label, _ = bare.controller(Policy(name="cap", k=2))
    assert isinstance(controller, CapController) and controller.k == 2 and label == "cap2"
    for name, flag in (("heuristic", "--controller BUNDLE"), ("stoprag", "--stoprag PATH")):
        with pytest.raises(ApiError) as caught:
            bare.controller(Policy(name=name))
        assert caught.value.status == 400 and flag in caught.value.detail and "not loaded" in caught.value.detail
    loaded = PolicyBook(CONFIG.stopping, StepPredictor())
    _, label, _ = loaded.controller(Policy(name="heuristic"))
    assert label == "heuristic(theta_p=0.3, theta_u=0.2, paper)"  # the server's stopping.* defaults
    _, label, _ = loaded.controller(Policy(name="heuristic", preset="paper_strict", theta_p=0.5, variant="give_up"))
    assert label == "heuristic(theta_p=0.5, theta_u=0.3, give_up)"


def searches(n: int):
    """An engine script: each question searches ``n`` times, then answers 'final'; probe i answers 'probe i'."""

    def script(request):
        done = request.prompt.count("Doc 1(")
        if request.prompt.endswith("<answer>"):
            return f" probe {done} </answer>"
        if done >= n:
            return "<think> done </think>\n<answer> final </answer>"
        return f"<think> look </think>\n<search> query {done} </search>"

    return script


def answerer(n_searches: int = 3, policies: PolicyBook | None = None, log_run=None, config=CONFIG) -> AgentAnswerer:
    return asyncio.run(
        AgentAnswerer.start(
            config,
            FakeRetriever(),
            policies or PolicyBook(config.stopping),
            lambda _cfg: FakeEngine(searches(n_searches)),
            log_run,
        )
    )


def answered(service: AgentAnswerer, data: dict, observer=None):
    return asyncio.run(service.answer(AnswerRequest.model_validate(data), observer))


def test_an_answer_carries_the_stop_reason_iterations_and_cost():
    service = answerer(3)
    natural = answer_body(answered(service, {"question": "Who?"}))
    assert (natural["answer"], natural["stop_reason"], natural["iterations"], natural["iterations_left"]) == (
        "final",
        STOP_ANSWER,
        3,
        0,
    )
    assert natural["f1"] is None and natural["policy"] == "natural" and "trajectory" not in natural
    spent = natural["cost"]
    assert spent["generated_tokens"] == spent["turn_tokens"] + spent["probe_tokens"] > 0
    assert spent["prompt_tokens"] > 0 and spent["searches_dropped"] == 0 and spent["wall_s"] >= 0
    assert natural["qid"].startswith("serve-")

    capped = answer_body(
        answered(
            service,
            {
                "question": "Who?",
                "policy": {"name": "cap", "k": 1},
                "return_trajectory": True,
                "golden_answers": ["probe 1"],
            },
        )
    )
    assert (capped["answer"], capped["stop_reason"], capped["iterations"]) == ("probe 1", STOP_CONTROLLER, 1)
    assert capped["iterations_left"] == 3 and capped["policy"] == "cap1" and capped["f1"] == 1.0
    assert capped["cost"]["searches_dropped"] == 1  # turn 1's search ran beside its probe, then the cap stopped
    rows = capped["trajectory"]["iterations"]
    assert [r["iteration"] for r in rows] == [0, 1] and rows[1]["query"] == "query 0"
    assert rows[1]["doc_ids"] == [f"query 0-{i}" for i in range(3)]  # the 3 the agent read, not the deep list
    assert (
        rows[1]["probe_f1"] == 1.0
        and rows[1]["p_hat"] is None
        and "<search> query 0 </search>" in capped["trajectory"]["transcript"]
    )
    assert natural["qid"] != capped["qid"]

    short = answer_body(answered(service, {"question": "Who?", "max_turns": 2}))
    assert (short["stop_reason"], short["iterations"], short["answer"]) == ("max_turns", 2, None)


def test_rows_are_streamed_as_they_come_unscored_unless_gold_is_given():
    service = answerer(2)
    seen: list[dict] = []
    answer = answered(service, {"question": "Who?"}, seen.append)
    assert [r["iteration"] for r in seen] == [0, 1, 2] and [r["probe_answer"] for r in seen] == [
        "probe 0",
        "probe 1",
        "probe 2",
    ]
    assert all(r["probe_f1"] is None and r["utility"] is None for r in seen)
    assert (
        all(r["probe_f1"] is None for r in answer.output.iterations)
        and answer.output.trajectory["golden_answers"] == []
    )
    scored: list[dict] = []
    answered(service, {"question": "Who?", "golden_answers": ["probe 2"]}, scored.append)
    assert [r["probe_f1"] for r in scored] == [0.5, 0.5, 1.0]


def test_concurrent_heuristic_requests_keep_their_own_predictions():
    predictor = StepPredictor()
    service = answerer(3, PolicyBook(CONFIG.stopping, predictor))

    async def both():
        strict = AnswerRequest(
            question="A?", policy=Policy(name="heuristic", theta_p=0.2, theta_u=0.0), return_trajectory=True
        )
        never = AnswerRequest(
            question="B?", policy=Policy(name="heuristic", theta_p=0.9, theta_u=0.9), return_trajectory=True
        )
        return await asyncio.gather(service.answer(strict), service.answer(never))

    stopped, natural = (answer_body(a) for a in asyncio.run(both()))
    # A: P̂_1 = 0.1 < 0.2 (state 2), P̂_2 = 0.2 >= 0.2 and Û >= 0 (state 0): stop at 2 with its probe
    assert (stopped["stop_reason"], stopped["iterations"], stopped["answer"]) == (STOP_CONTROLLER, 2, "probe 2")
    assert stopped["policy"] == "heuristic(theta_p=0.2, theta_u=0, paper)"
    assert [(r["p_hat"], r["u_hat"]) for r in stopped["trajectory"]["iterations"]] == [
        (None, None),
        (0.1, 0.05),
        (0.2, 0.05),
    ]
    assert (natural["stop_reason"], natural["iterations"]) == (STOP_ANSWER, 3)
    assert [r["p_hat"] for r in natural["trajectory"]["iterations"]] == [None, 0.1, 0.2, pytest.approx(0.3)]
    assert sorted(predictor.asked) == [("A?", 1), ("A?", 2), ("B?", 1), ("B?", 2), ("B?", 3)]


def test_the_request_log_is_a_probe_run(tmp_path):
    run = RunDir(tmp_path / "log")
    service = answerer(1, log_run=run.path)
    answered(service, {"question": "Who?", "golden_answers": ["final"], "dataset": "hotpotqa"})
    answered(service, {"question": "What?", "policy": {"name": "cap", "k": 0}})
    trajectories, iterations = run.read("trajectories"), run.read("iterations")
    assert trajectories.schema == TRAJECTORIES and iterations.schema == ITERATIONS
    rows = {t["question"]: t for t in trajectories.to_pylist()}
    assert (
        rows["Who?"]["final_f1"] == 1.0
        and rows["Who?"]["dataset"] == "hotpotqa"
        and rows["Who?"]["golden_answers"] == ["final"]
    )
    assert rows["What?"]["final_f1"] is None and rows["What?"]["stop_reason"] == STOP_CONTROLLER
    assert sorted(iterations.column("qid").to_pylist()) == sorted([rows["Who?"]["qid"]] * 2 + [rows["What?"]["qid"]])
    assert load_config(run.path / "config.yaml").agent.max_turns == 4  # the probe job's resolved config
    assert yaml.safe_load((run.path / "probe_info.yaml").read_text())["service"]["command"] == "raypipe serve-agent"
    with pytest.raises(ConfigError):  # as a probe rerun: another agent setting is refused
        check_resumable(load_config("embedded", ["agent.max_turns=2"]), run)
    again = answerer(1, log_run=run.path)  # a restart with the same settings adds to the log
    answered(again, {"question": "Where?"})
    assert run.read("trajectories").num_rows == 3


def test_the_request_log_keeps_every_row_of_64_concurrent_requests(tmp_path):
    """Each request's rows land in their own part, whatever the threads writing beside it do: nothing lost, nothing
    mixed, both tables hold the same questions."""
    run = RunDir(tmp_path / "log")
    service = answerer(1, log_run=run.path)

    async def many():
        return await asyncio.gather(*(service.answer(AnswerRequest(question=f"q{i}?")) for i in range(64)))

    answers = asyncio.run(many())
    qids = {a.output.trajectory["qid"] for a in answers}
    trajectories, iterations = run.read("trajectories"), run.read("iterations")
    assert trajectories.num_rows == 64 and set(trajectories.column("qid").to_pylist()) == qids
    assert iterations.num_rows == 2 * 64 and set(iterations.column("qid").to_pylist()) == qids
    assert len(list((run.path / "trajectories").glob("*.parquet"))) == 64


def test_the_in_flight_bound_and_the_deadline():
    admission = Admission(2)
    admission.enter()
    admission.enter()
    with pytest.raises(ApiError) as full:
        admission.enter()
    assert full.value.status == 429 and "serve_agent.max_in_flight" in full.value.detail
    assert full.value.headers == {"Retry-After": "1"}
    admission.leave()
    admission.enter()
    with pytest.raises(ApiError) as late:
        asyncio.run(within_deadline(asyncio.sleep(5), 0.05))
    assert late.value.status == 408 and "serve_agent.timeout_s" in late.value.detail


def test_chat_replies_and_events_follow_openai_and_sse():
    reply = chat_body(
        {"answer": "Tim Burton", "cost": {"prompt_tokens": 30, "generated_tokens": 7}, "stop_reason": "answer"},
        "raypipe-agent",
        "chatcmpl-1",
        123,
    )
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "Tim Burton"}
    assert reply["usage"] == {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37}
    assert reply["raypipe"]["stop_reason"] == "answer" and reply["object"] == "chat.completion"
    chunks = chat_chunks(reply)
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant"}, {"content": "Tim Burton"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["raypipe"]["stop_reason"] == "answer"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert sse({"a": 1}, "answer") == 'event: answer\ndata: {"a": 1}\n\n' and sse("[DONE]") == "data: [DONE]\n\n"


def test_the_documented_cluster_command_places_each_replica_on_a_generation_gpu():
    """docs/serve-agent.md's cluster command: each agent replica asks one GPU and the generation nodes' resource, as
    the preset's generation actors do (so none lands on a retrieval node's GPU)."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "serve-agent.md").read_text()
    section = text.split("## On a cluster", 1)[1]
    command = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    words = shlex.split(command)
    preset = words[words.index("--config") + 1]
    config = load_config(preset, [words[i + 1] for i, w in enumerate(words) if w == "--set"])
    assert config.serve_agent.num_gpus == 1 and config.serve_agent.resources == {"raypipe_generation": 1}
    assert config.generation.resources == config.serve_agent.resources
    assert "raypipe_generation" not in config.retrieval.actors.resources


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_policy_thresholds_refuse_nan_and_infinity(value):
    for field in ("theta_p", "theta_u"):
        raw = f'{{"question": "q", "policy": {{"name": "heuristic", "{field}": {value}}}}}'.encode()
        error = refused(raw)
        assert error.status == 422 and f"policy.{field}" in error.detail and "finite" in error.detail
        chat = (
            '{"messages": [{"role": "user", "content": "q"}], '
            f'"policy": {{"name": "heuristic", "{field}": {value}}}}}'
        )
        assert refused(chat.encode(), parse_chat_request).status == 422


def test_a_reply_shows_an_error_without_paths_addresses_or_traceback():
    from raypipe.agents.answer_api import public_error

    raw = (
        "OSError: [Errno 2] No such file: '/root/.cache/raypipe/models/smollm2/model.bin' via "
        'http://10.0.3.7:8000/retrieve and ./runs/x/y\nTraceback (most recent call last):\n  File "/srv/a.py"'
    )
    shown = public_error(raw)
    assert shown == "OSError: [Errno 2] No such file: '<hidden>' via <hidden> and <hidden>"
    assert public_error(None) is None and public_error("EngineError: prompt too long") == "EngineError: prompt too long"


def test_health_names_the_model_but_no_path():
    class LocalModelEngine(FakeEngine):
        def describe(self):
            from pathlib import Path

            from raypipe.llm.common import engine_record

            return engine_record(self, CONFIG.engine, Path("/root/.cache/raypipe/models/smollm2"))

    config = load_config("embedded", ["engine.model=/data/models/my-model"])
    service = asyncio.run(
        AgentAnswerer.start(
            config, FakeRetriever(), PolicyBook(config.stopping), lambda _cfg: LocalModelEngine(searches(1))
        )
    )
    described = service.describe()
    assert described["engine"]["model"] == "my-model" and described["request_log"] is False
    assert "/" not in json.dumps(described["engine"])


def test_the_dataset_field_names_the_rows_dataset_and_selects_nothing(tmp_path):
    """`dataset` is written on the rows (reply and request log); the heuristic's decisions are the same whatever it
    says, and docs/serve-agent.md says so instead of promising per-dataset thresholds or question types."""
    from pathlib import Path

    run = RunDir(tmp_path / "log")
    service = answerer(3, PolicyBook(CONFIG.stopping, StepPredictor()), log_run=run.path)
    policy = {"name": "heuristic", "theta_p": 0.2, "theta_u": 0.0}
    replies = [
        answer_body(answered(service, {"question": "A?", "policy": policy, "dataset": name}))
        for name in ("hotpotqa", "musique")
    ]
    assert [(r["stop_reason"], r["iterations"], r["answer"]) for r in replies] == [(STOP_CONTROLLER, 2, "probe 2")] * 2
    assert sorted(run.read("trajectories").column("dataset").to_pylist()) == ["hotpotqa", "musique"]
    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "serve-agent.md").read_text().split())
    assert "It selects nothing" in docs and "names the question's dataset for per-dataset thresholds" not in docs


def test_a_resume_is_not_refused_when_only_service_limits_or_client_retries_changed(tmp_path):
    """check_resumable (the probe job's rerun and the request log): limits of the services, client retries and
    timeouts, replica placement do not change what a run's rows say; what searches or generates does."""
    run = RunDir(tmp_path / "log")
    answered(answerer(1, log_run=run.path), {"question": "Who?"})
    operational = [
        "retrieval.http.retries=9",
        "retrieval.http.timeout_s=5",
        "retrieval.actors.max_task_retries=0",
        "retrieval.serve.max_queries=8",
        "retrieval.serve.max_topk=200",
        "retrieval.serve.timeout_s=2",
        "retrieval.serve.max_body_bytes=4096",
        "retrieval.actors.replicas=3",
        "retrieval.actors.num_cpus=1",
        "retrieval.start_timeout_s=10",
        "engine.max_retries=7",
        "engine.request_timeout_s=9",
    ]
    check_resumable(load_config("embedded", operational), run)
    for changed in ("retrieval.deep_k=50", "retrieval.index.nprobe=4", "engine.max_model_len=2048"):
        with pytest.raises(ConfigError, match=changed.split("=")[0].replace(".", r"\.")):
            check_resumable(load_config("embedded", [changed]), run)

"""benchmarks/probe.py's offline-turn-sync baseline: the batching adapter over vLLM's offline ``LLM`` (a fake ``LLM``
here: what is tested is the code around it) and where two runs' transcripts differ (the step model is in
tests/test_benchmark_probe.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from raypipe.agents import AgentLoop, SearchR1, TrajectoryOutput
from raypipe.core.config import AgentConfig, EngineConfig
from raypipe.data.loaders import Question
from raypipe.llm.base import EngineError, GenerationRequest
from raypipe.testing.fakes import TEMPLATE, FakeRetriever

ROOT = Path(__file__).resolve().parents[1]
HOPS = [0, 1, 2, 3]  # searches before each question's answer
QUESTIONS = [
    Question(qid=f"q{i}", dataset="toy", question=f"Question number {i}", golden_answers=[f"answer {i}"])
    for i in range(len(HOPS))
]


def load(name: str, file: str):
    """A module of benchmarks/, imported by path (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def offline():
    yield load("offline_engine", "offline_engine.py")
    del sys.modules["offline_engine"]


@pytest.fixture(scope="module")
def bench():
    yield load("benchmark_probe_offline", "probe.py")
    del sys.modules["benchmark_probe_offline"]


class CharTokenizer:
    """One token per character: prompts round-trip exactly through token ids."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def count_tokens(self, text: str) -> int:
        return len(text)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(TEMPLATE.format(content=m["content"]) for m in messages)


def scripted(prompt: str) -> str:
    """Question i searches HOPS[i] times, then answers; probes answer with the number of documents read."""
    index = int(re.search(r"Question number (\d+)", prompt).group(1))
    read = prompt.count("<information>Doc")
    if prompt.endswith("<answer>"):
        return f" answer {read} </answer>"
    if read < HOPS[index]:
        return f"<think> hop {read} of {index} </think>\n<search> q{index} hop {read} </search>"
    return f"<think> done {index} </think>\n<answer> answer {index} </answer>"


class FakeLLM:
    """vLLM's offline ``LLM.generate`` over a script: records each call's prompts; outputs as vLLM shapes them
    (stop strings cut off, one token per word, log-probs where asked)."""

    def __init__(self, script=scripted, fail: Exception | None = None, aborted: tuple[str, ...] = ()):
        self.script, self.fail, self.aborted = script, fail, aborted  # aborted: prompts vLLM ends with "abort"
        self.calls: list[list[str]] = []

    def generate(self, prompts, params, use_tqdm=True):
        texts = ["".join(map(chr, p["prompt_token_ids"])) for p in prompts]
        self.calls.append(texts)
        if self.fail is not None:
            raise self.fail
        return [self._output(prompt, p, text) for prompt, p, text in zip(prompts, params, texts)]

    def _output(self, prompt, params, text: str):
        out, stop_string = self.script(text), None
        cuts = [(out.find(s), s) for s in params.stop or () if s in out]
        if cuts:
            at, stop_string = min(cuts)
            out = out[:at]
        tokens = list(range(len(out.split())))
        logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in tokens] if params.logprobs is not None else None
        finish = "abort" if text in self.aborted else "stop"
        completion = SimpleNamespace(
            text=out, token_ids=tokens, logprobs=logprobs, finish_reason=finish, stop_reason=stop_string
        )
        return SimpleNamespace(
            outputs=[completion], prompt_token_ids=prompt["prompt_token_ids"], num_cached_tokens=0, metrics=None
        )


def engine_over(offline, llm: FakeLLM):
    return offline.OfflineBatchEngine(llm, CharTokenizer(), EngineConfig(max_model_len=8192))


def run_lockstep(engine, questions: list[Question]) -> list[TrajectoryOutput]:
    async def lock_step():
        loop = AgentLoop(
            engine,
            FakeRetriever(n=5),
            SearchR1("pyterrier"),
            AgentConfig(max_turns=5),
            top_k=3,
            deep_k=5,
            barrier=engine.lockstep_barrier(len(questions)),
        )
        return list(await asyncio.wait_for(asyncio.gather(*(loop.run(q) for q in questions)), timeout=30))

    return asyncio.run(lock_step())


def test_one_generate_call_per_phase_over_every_live_trajectory(offline):
    llm = FakeLLM()
    engine = engine_over(offline, llm)
    outputs = run_lockstep(engine, QUESTIONS)
    # each caller got its own output: every question ends with its own answer after its own number of searches
    assert [(o.trajectory["final_answer"], o.trajectory["n_iterations"]) for o in outputs] == [
        (f"answer {i}", hops) for i, hops in enumerate(HOPS)
    ]
    assert [o.iterations[-1]["probe_answer"] for o in outputs] == [f"answer {hops}" for hops in HOPS]
    # per turn one call with every live trajectory's turn, then one with all their probes; an answered
    # trajectory leaves, so the next turn's batch is one smaller
    assert [len(call) for call in llm.calls] == [4, 4, 3, 3, 2, 2, 1, 1]
    assert engine.batch_sizes == [4, 4, 3, 3, 2, 2, 1, 1]
    for turn, call in enumerate(llm.calls):
        probes = [prompt.endswith("<answer>") for prompt in call]
        assert all(probes) if turn % 2 else not any(probes)
        assert sorted(int(re.search(r"Question number (\d+)", p).group(1)) for p in call) == list(range(turn // 2, 4))


def test_a_trajectory_that_fails_before_its_request_does_not_hold_the_batch(offline):
    """A prompt over the context ends its trajectory without a request: the others' batch runs without it."""
    long = Question(qid="long", dataset="toy", question="Question number 3 " + "x" * 9000, golden_answers=["a"])
    llm = FakeLLM()
    outputs = run_lockstep(engine_over(offline, llm), [*QUESTIONS[:3], long])
    assert outputs[3].trajectory["stop_reason"] == "context_overflow" and outputs[3].iterations == []
    assert [o.trajectory["stop_reason"] for o in outputs[:3]] == ["answer"] * 3
    assert [len(call) for call in llm.calls] == [3, 3, 2, 2, 1, 1]


def test_a_failed_call_fails_every_request_in_it(offline):
    engine = engine_over(offline, FakeLLM(fail=RuntimeError("engine core gone")))

    async def three_parties():
        engine.lockstep_barrier(3)
        requests = [engine.generate(GenerationRequest(prompt=f"prompt {i}", max_tokens=8)) for i in range(3)]
        return await asyncio.gather(*requests, return_exceptions=True)

    errors = asyncio.run(three_parties())
    assert engine.batch_sizes == [3]
    assert all(isinstance(e, EngineError) and "RuntimeError: engine core gone" in str(e) for e in errors)


def test_a_failed_request_fails_only_its_caller(offline):
    """A request vLLM ended for another reason than stop or length (to_generation refuses it) fails alone."""
    llm = FakeLLM(script=lambda prompt: f"reply to {prompt}", aborted=("second",))
    engine = engine_over(offline, llm)

    async def three_parties():
        engine.lockstep_barrier(3)
        requests = [engine.generate(GenerationRequest(prompt=p, max_tokens=8)) for p in ("first", "second", "third")]
        return await asyncio.gather(*requests, return_exceptions=True)

    first, second, third = asyncio.run(three_parties())
    assert (first.text, third.text) == ("reply to first", "reply to third") and len(llm.calls) == 1
    assert isinstance(second, EngineError) and "'abort'" in str(second)


def test_a_party_waiting_at_the_barrier_completes_the_batch(offline):
    """A party that reaches the barrier without a request leaves the others' requests the whole phase."""
    llm = FakeLLM(script=lambda prompt: "ok")
    engine = engine_over(offline, llm)

    async def scenario():
        barrier = engine.lockstep_barrier(3)

        async def requester(i: int) -> str:
            gen = await engine.generate(GenerationRequest(prompt=f"p{i}", max_tokens=4))
            await barrier.wait()
            return gen.text

        return await asyncio.wait_for(asyncio.gather(requester(0), requester(1), barrier.wait()), timeout=10)

    assert asyncio.run(scenario())[:2] == ["ok", "ok"]
    assert llm.calls == [["p0", "p1"]]


def test_without_a_barrier_every_request_is_its_own_call(offline):
    llm = FakeLLM(script=lambda prompt: "ok")
    engine = engine_over(offline, llm)
    asyncio.run(engine.warmup(["[a-z]+"]))  # the async engine's warm-up: one request, then one per regex
    assert llm.calls == [["Hello"], ["Hello"]] and engine.batch_sizes == [1, 1]


def result(bench, name: str, trajectories: dict[str, tuple[list[str], str]]):
    """A run of trajectories (qid -> (each row's reasoning, the transcript's tail)), transcripts built from them."""
    outputs = [
        TrajectoryOutput(
            {"qid": qid, "transcript": "".join(reasoning) + tail},
            [{"iteration": i, "reasoning": r} for i, r in enumerate(reasoning)],
        )
        for qid, (reasoning, tail) in trajectories.items()
    ]
    return bench.Result(name, 0, 1.0, outputs, bench.SharedEngine(engine=None))


def test_transcript_differences_name_the_first_differing_iteration(bench):
    a = result(
        bench,
        "probe",
        {
            "same": (["a", "b"], ""),
            "turn": (["x" * 30, "search Paris"], ""),
            "longer": (["a"], ""),
            "tail": (["a"], " forced Paris"),
        },
    )
    b = result(
        bench,
        "offline-turn-sync",
        {
            "same": (["a", "b"], ""),
            "turn": (["x" * 30, "search Rome"], ""),
            "longer": (["a", "b"], ""),
            "tail": (["a"], " forced Rome"),
        },
    )
    assert bench.differing(a, b) == 3
    differences = {d.qid: d for d in bench.transcript_differences(a, b)}
    assert differences.keys() == {"turn", "longer", "tail"}
    where = {qid: (d.iteration, d.a, d.b) for qid, d in differences.items()}
    assert where["turn"] == (1, "search Paris", "search Rome")
    assert where["longer"] == (1, "", "b")  # a row one run lacks counts as empty
    assert where["tail"] == (None, "a forced Paris", "a forced Rome")  # every row agrees: the transcripts
    window = bench.first_difference("y" * 100 + "A" + "z" * 100, "y" * 100 + "B" + "z" * 100)
    assert window == ("y" * 10 + "A" + "z" * 49, "y" * 10 + "B" + "z" * 49)


def test_the_offline_engine_loads_the_runs_agent_as_the_async_engine_does(offline, monkeypatch):
    """The embedded default runs the tuned agent (engine.adapter): the peers' design must run the same model, not
    the base one (it did until 2026-12-06: every transcript differed from the stage's at iteration 0)."""
    import vllm

    from raypipe.core.config import load_config
    from raypipe.core.models import engine_model

    loaded: dict = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: loaded.update(kwargs) or SimpleNamespace())
    config = load_config().engine
    assert config.adapter is not None
    engine = offline.start_offline_engine(config)
    assert loaded["model"] == str(engine_model(config)) == str(engine.model_path)
    assert "+agent-" in Path(loaded["model"]).name  # the artifact merged, not the base model's folder

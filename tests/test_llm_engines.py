"""Real engines on the embedded SmolLM2: offline load, vLLM == transformers (greedy, float32), regex
enforcement, prefix-cache hits. One vLLM engine is shared by the module (a start costs 20-35 s)."""

import asyncio
import re

import pytest

from raypipe.core.config import EngineConfig
from raypipe.data.loaders import load_questions
from raypipe.llm.base import ContextOverflowError, EngineError, GenerationRequest
from raypipe.llm.factory import build_engine

pytestmark = pytest.mark.slow

# Search-R1's prompt, verbatim ("as your want" is original); golden copy kept here so the test does not
# depend on the agent modules.
SEARCH_R1 = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Question: {question}\n"
)
STOPS = ("</search>", "</answer>")
FORMAT = (
    r"<think> ?[^\s<>][^<>]{0,120}</think>\n"
    r"(<search> ?[^\s<>][^<>\n]{0,60}</search>|<answer> ?[^\s<>][^<>\n]{0,40}</answer>)"
)


def run(coro):
    return asyncio.run(coro)


def search_r1_prompt(engine, question):
    return engine.apply_chat_template([{"role": "user", "content": SEARCH_R1.format(question=question)}])


@pytest.fixture(scope="module")
def questions():
    return [q.question for q in load_questions("hotpotqa", limit=6)]


@pytest.fixture(scope="module")
def hf_engine():
    engine = build_engine(EngineConfig(backend="transformers", dtype="float32", max_model_len=1024))
    yield engine
    run(engine.close())


@pytest.fixture(scope="module")
def vllm_engine():
    engine = build_engine(
        EngineConfig(
            backend="vllm", dtype="float32", max_model_len=1024, kv_cache_gib=0.5, block_size=32, enforce_eager=True
        )
    )
    yield engine
    run(engine.close())


def test_embedded_llm_loads_offline_and_generates_a_sentence(hf_engine):
    prompt = hf_engine.apply_chat_template([{"role": "user", "content": "Write one sentence about the sea."}])
    gen = run(hf_engine.generate(GenerationRequest(prompt=prompt, max_tokens=24, logprobs=True)))
    assert len(gen.text.split()) >= 4, gen.text
    assert len(gen.token_ids) == len(gen.token_logprobs) <= 24
    assert all(lp <= 0 for lp in gen.token_logprobs)
    assert gen.prompt_tokens == hf_engine.count_tokens(prompt)
    assert gen.cached_prompt_tokens == 0 and gen.engine_s > 0 and gen.queue_s >= 0  # no prefix cache; timed


def test_transformers_stops_at_the_first_stop_string_and_rejects_regex(hf_engine):
    prompt = hf_engine.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    free = run(hf_engine.generate(GenerationRequest(prompt=prompt, max_tokens=10)))
    stop = free.text.split()[2]  # a stop string the free continuation contains
    gen = run(hf_engine.generate(GenerationRequest(prompt=prompt, max_tokens=10, stop=("never seen", stop))))
    assert gen.stop_string == stop and gen.finish_reason == "stop"
    assert gen.text == free.text[: free.text.index(stop)]
    with pytest.raises(EngineError, match="regex"):
        run(hf_engine.generate(GenerationRequest(prompt=prompt, max_tokens=5, regex="a+")))


def test_vllm_greedy_float32_equals_transformers(vllm_engine, hf_engine, questions):
    prompts = [search_r1_prompt(vllm_engine, q) for q in questions[:3]]
    assert prompts == [search_r1_prompt(hf_engine, q) for q in questions[:3]]
    requests = [GenerationRequest(prompt=p, max_tokens=32, stop=STOPS, logprobs=True) for p in prompts]

    async def both():
        fast = await asyncio.gather(*(vllm_engine.generate(r) for r in requests))  # concurrently on one engine
        slow = [await hf_engine.generate(r) for r in requests]
        return fast, slow

    fast, slow = run(both())
    for v, h in zip(fast, slow):
        assert v.text == h.text
        assert v.token_ids == h.token_ids
        assert (v.finish_reason, v.stop_string, v.prompt_tokens) == (h.finish_reason, h.stop_string, h.prompt_tokens)
        assert v.token_logprobs == pytest.approx(h.token_logprobs, abs=5e-3)


def test_vllm_regex_enforcement(vllm_engine, questions):
    timings = run(vllm_engine.warmup([FORMAT]))
    assert set(timings) == {"", FORMAT}
    prompt = search_r1_prompt(vllm_engine, questions[3])
    gen = run(vllm_engine.generate(GenerationRequest(prompt=prompt, max_tokens=200, regex=FORMAT)))
    assert re.fullmatch(FORMAT, gen.text), gen.text


def test_vllm_prefix_cache_hits_when_a_prompt_extends_another(vllm_engine, questions):
    first = search_r1_prompt(vllm_engine, questions[4])
    gen = run(vllm_engine.generate(GenerationRequest(prompt=first, max_tokens=24, stop=STOPS)))
    probe = first + gen.text + "\n\n<answer>"
    hit = run(vllm_engine.generate(GenerationRequest(prompt=probe, max_tokens=8, stop=("</answer>",))))
    record = vllm_engine.describe()
    block = record["block_size"]
    assert block == 32 and record["supports_regex"] is True
    assert hit.cached_prompt_tokens >= (gen.prompt_tokens // block) * block > 0
    assert hit.cached_prompt_tokens % block == 0
    assert hit.engine_s > 0 and hit.queue_s >= 0  # vLLM's request timestamps (engine.request_timings)


def test_vllm_per_request_failures_leave_the_engine_serving(vllm_engine):
    with pytest.raises(ContextOverflowError):
        run(vllm_engine.generate(GenerationRequest(prompt="word " * 1500, max_tokens=4)))
    with pytest.raises(EngineError):
        run(vllm_engine.generate(GenerationRequest(prompt="Hi", max_tokens=4, regex="(unclosed")))
    clamped = run(vllm_engine.generate(GenerationRequest(prompt="word " * 1016, max_tokens=50)))
    assert clamped.prompt_tokens > 1000 and 1 <= len(clamped.token_ids) <= 1024 - clamped.prompt_tokens
    assert run(vllm_engine.generate(GenerationRequest(prompt="Hi", max_tokens=4))).token_ids

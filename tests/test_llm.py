"""Request handling of the generation backends, without loading a model."""

import asyncio
from types import SimpleNamespace

import pytest

from raypipe.core.config import EngineConfig
from raypipe.core.loopthread import LoopThread
from raypipe.llm.base import ContextOverflowError, EngineError, EngineUnavailableError, GenerationRequest
from raypipe.llm.common import check_request, find_stop, fit_max_tokens
from raypipe.llm.factory import build_engine


@pytest.mark.parametrize(
    "prompt_tokens, max_tokens, expected",
    [(10, 5, 5), (90, 50, 10), (99, 50, 1), (0, 200, 100)],
)
def test_fit_max_tokens_clamps_to_the_room_left(prompt_tokens, max_tokens, expected):
    assert fit_max_tokens(prompt_tokens, max_tokens, max_model_len=100) == expected


@pytest.mark.parametrize("prompt_tokens", [100, 150])
def test_fit_max_tokens_raises_when_the_prompt_alone_fills_the_context(prompt_tokens):
    with pytest.raises(ContextOverflowError, match=f"prompt of {prompt_tokens} tokens"):
        fit_max_tokens(prompt_tokens, 10, max_model_len=100)


def test_context_overflow_is_an_engine_error():
    assert issubclass(ContextOverflowError, EngineError)
    with pytest.raises(EngineError, match="max_tokens"):
        fit_max_tokens(1, 0, max_model_len=100)


@pytest.mark.parametrize(
    "field, value, message",
    [("temperature", -0.1, "temperature"), ("top_p", 0.0, "top_p"), ("top_p", 1.5, "top_p"), ("stop", ("",), "stop")],
)
def test_check_request_names_the_bad_field(field, value, message):
    request = GenerationRequest(prompt="x", max_tokens=1, **{field: value})
    with pytest.raises(EngineError, match=message):
        check_request(request)


def test_find_stop_only_looks_where_new_text_can_complete_a_stop():
    # "</search>" ended two tokens ago: it is outside the window of the last 3 characters
    assert find_stop("a</search>bcd", ("</search>",), new_chars=3) is None
    assert find_stop("a</search>", ("</search>",), new_chars=3) == (1, "</search>")
    # a stop string completed by the last character, straddling old and new text
    assert find_stop("ab</ans", ("</ans",), new_chars=1) == (2, "</ans")


def test_find_stop_tries_stops_in_the_order_given():
    text = "x</answer> and </search>"
    assert find_stop(text, ("</search>", "</answer>"), new_chars=len(text)) == (15, "</search>")
    assert find_stop(text, ("</answer>", "</search>"), new_chars=len(text)) == (1, "</answer>")
    assert find_stop(text, (), new_chars=len(text)) is None


def _vllm():
    return pytest.importorskip("raypipe.llm.vllm_engine")


def test_vllm_sampling_params_follow_the_request():
    params = _vllm().sampling_params(
        GenerationRequest(
            prompt="p",
            max_tokens=64,
            temperature=0.7,
            top_p=0.9,
            stop=("</search>",),
            logprobs=True,
            regex="a+",
            seed=3,
        ),
        max_tokens=10,
    )
    assert params.max_tokens == 10
    assert (params.temperature, params.top_p, params.seed) == (0.7, 0.9, 3)
    assert params.stop == ["</search>"] and params.include_stop_str_in_output is False
    assert params.logprobs == 0
    assert params.structured_outputs.regex == "a+"
    plain = _vllm().sampling_params(GenerationRequest(prompt="p", max_tokens=5), max_tokens=5)
    assert plain.logprobs is None and plain.structured_outputs is None and not plain.stop


def _request_output(text="hi", token_ids=(5, 6), finish="stop", stop_reason=None, logprobs=None, cached=0):
    completion = SimpleNamespace(
        text=text, token_ids=list(token_ids), finish_reason=finish, stop_reason=stop_reason, logprobs=logprobs
    )
    return SimpleNamespace(outputs=[completion], prompt_token_ids=[1, 2, 3], num_cached_tokens=cached)


def test_vllm_output_becomes_a_generation():
    logprobs = [
        {5: SimpleNamespace(logprob=-0.5), 9: SimpleNamespace(logprob=-3.0)},
        {6: SimpleNamespace(logprob=-1.25)},
    ]
    gen = _vllm().to_generation(_request_output(stop_reason="</search>", logprobs=logprobs, cached=32), True)
    assert gen.text == "hi" and gen.token_ids == [5, 6]
    assert gen.token_logprobs == [-0.5, -1.25]
    assert (gen.finish_reason, gen.stop_string) == ("stop", "</search>")
    assert (gen.prompt_tokens, gen.cached_prompt_tokens) == (3, 32)


def test_vllm_request_metrics_become_queue_and_engine_seconds():
    output = _request_output()
    output.metrics = SimpleNamespace(queued_ts=10.0, scheduled_ts=10.5, first_token_ts=11.0, last_token_ts=12.25)
    gen = _vllm().to_generation(output, False)
    assert (gen.queue_s, gen.engine_s) == (0.5, 1.75)
    unrecorded = _vllm().to_generation(_request_output(), False)  # stats off: vLLM attaches no metrics
    assert (unrecorded.queue_s, unrecorded.engine_s) == (None, None)


def test_vllm_stats_follow_request_timings():
    from raypipe.core.config import EngineConfig

    on = _vllm().engine_kwargs(EngineConfig(), "/m", on_cpu=True)
    off = _vllm().engine_kwargs(EngineConfig(request_timings=False), "/m", on_cpu=True)
    assert (on["disable_log_stats"], off["disable_log_stats"]) == (False, True)


def test_vllm_output_stop_token_id_and_abort():
    to_generation = _vllm().to_generation
    gen = to_generation(_request_output(stop_reason=2, finish="length"), False)  # a stop token id, not a string
    assert gen.stop_string is None and gen.finish_reason == "length" and gen.token_logprobs is None
    with pytest.raises(EngineUnavailableError, match="abort"):  # aborted by a live engine: not the request's fault
        to_generation(_request_output(finish="abort"), False)


def test_vllm_engine_arguments_on_cpu_and_gpu():
    module = _vllm()
    config = EngineConfig(kv_cache_gib=1.5, block_size=32, dtype="float32", max_num_seqs=8)
    cpu = module.engine_kwargs(config, "/m", on_cpu=True)
    assert cpu["kv_cache_memory_bytes"] == int(1.5 * 2**30) and "gpu_memory_utilization" not in cpu
    assert (cpu["block_size"], cpu["dtype"], cpu["max_num_seqs"], cpu["enable_prefix_caching"]) == (
        32,
        "float32",
        8,
        True,
    )
    assert cpu["structured_outputs_config"] == {"backend": "xgrammar"}
    gpu = module.engine_kwargs(EngineConfig(block_size=None, tensor_parallel_size=2), "/m", on_cpu=False)
    assert "kv_cache_memory_bytes" not in gpu and "block_size" not in gpu
    assert (gpu["gpu_memory_utilization"], gpu["tensor_parallel_size"]) == (0.9, 2)
    levers = {"max_num_batched_tokens", "enable_chunked_prefill", "speculative_config"}  # unset: vLLM's defaults
    assert not levers & cpu.keys() and not levers & gpu.keys()


def test_vllm_environment(monkeypatch):
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    env = _vllm().vllm_environment
    assert env(EngineConfig(cpu_threads="0-1", regex_compile_timeout_s=30), on_cpu=True) == {
        "VLLM_REGEX_COMPILATION_TIMEOUT_S": "30",
        "VLLM_USE_AOT_COMPILE": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    default = env(EngineConfig(), on_cpu=True)  # every core, none reserved for the frontend
    assert (default["VLLM_CPU_OMP_THREADS_BIND"], default["VLLM_CPU_NUM_OF_RESERVED_CPU"]) == ("auto", "0")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env(EngineConfig(cpu_threads=None), on_cpu=True)
    assert env(EngineConfig(), on_cpu=False) == {"VLLM_REGEX_COMPILATION_TIMEOUT_S": "60"}  # GPU: nothing CPU-only
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")  # the user's own choice wins
    assert "VLLM_USE_AOT_COMPILE" not in env(EngineConfig(), on_cpu=True)


def test_transformers_sampling_greedy_and_nucleus():
    torch = pytest.importorskip("torch")
    from raypipe.llm.hf_engine import _sample

    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    assert _sample(logits, 0.0, 1.0, None) == 1
    generator = torch.Generator().manual_seed(0)
    # top_p small enough to keep only the most likely token
    assert {_sample(logits, 1.0, 0.1, generator) for _ in range(20)} == {1}
    # at a high temperature without a nucleus, other tokens appear
    assert len({_sample(logits, 5.0, 1.0, generator) for _ in range(50)}) > 1


def test_factory_builds_the_http_backend_and_describes_it():
    config = EngineConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="served-name")
    engine = build_engine(config)
    info = engine.describe()
    assert info["backend"] == "openai" and info["model"] == "served-name"
    assert info["supports_regex"] is True and info["base_url"] == "http://127.0.0.1:9/v1"
    assert info["model_path"] is None  # "served-name" is no local model: no tokenizer
    with pytest.raises(EngineError, match="no local tokenizer"):
        engine.count_tokens("x")
    assert asyncio.run(engine.warmup(["a+"])) == {}  # nothing to prepare on the client side


def test_every_backend_declares_its_capabilities():
    from raypipe.llm.hf_engine import TransformersEngine
    from raypipe.llm.openai_engine import OpenAIEngine
    from raypipe.llm.vllm_engine import VLLMEngine

    assert VLLMEngine.supports_regex is True  # structured outputs (recorded as such in the run's engine record)
    assert TransformersEngine.supports_regex is False and OpenAIEngine.supports_regex is True
    for backend in (VLLMEngine, TransformersEngine, OpenAIEngine):
        assert callable(backend.warmup) and callable(backend.describe)


def test_factory_rejects_an_http_backend_without_url():
    with pytest.raises(EngineError, match="base_url"):
        build_engine(EngineConfig(backend="openai"))


class FakeAsyncLLM:
    """Stands in for vLLM's AsyncLLM: records requests and the loop each ran on."""

    def __init__(self):
        self.requests, self.loops, self.shut = [], set(), False
        self.errored = False  # AsyncLLM's flag for an engine that died or hit a fatal error

    async def generate(self, prompt, params, request_id):
        self.loops.add(asyncio.get_running_loop())
        self.requests.append((prompt, params))
        if params.max_tokens == 13:
            raise RuntimeError("boom")
        yield _request_output(text=f"{len(prompt)} tokens")

    def shutdown(self):
        self.shut = True


@pytest.fixture
def fake_vllm_engine():
    module = _vllm()
    engine = object.__new__(module.VLLMEngine)  # no real engine: only the request plumbing
    engine.config, engine.max_model_len = EngineConfig(), 64
    engine.tokenizer = SimpleNamespace(encode=lambda text: list(range(len(text.split()))))
    engine._llm, engine._loop = FakeAsyncLLM(), LoopThread("test-vllm")
    engine._engine_input = lambda ids: ids
    yield engine
    asyncio.run(engine.close())


def test_vllm_engine_serves_callers_on_any_event_loop(fake_vllm_engine):
    engine, llm = fake_vllm_engine, fake_vllm_engine._llm
    first = asyncio.run(engine.generate(GenerationRequest(prompt="a b c", max_tokens=5)))

    async def many():
        return await asyncio.gather(
            *(engine.generate(GenerationRequest(prompt="a " * n, max_tokens=100)) for n in range(1, 4))
        )

    rest = asyncio.run(many())  # a second, different caller loop
    assert first.text == "3 tokens" and [g.text for g in rest] == ["1 tokens", "2 tokens", "3 tokens"]
    assert len(llm.loops) == 1 and llm.loops == {engine._loop.loop}  # vLLM always sees its own loop
    assert [params.max_tokens for _, params in llm.requests] == [5, 63, 62, 61]  # clamped to the context


def test_vllm_engine_request_failures(fake_vllm_engine):
    engine, llm = fake_vllm_engine, fake_vllm_engine._llm
    with pytest.raises(ContextOverflowError):
        asyncio.run(engine.generate(GenerationRequest(prompt="a " * 64, max_tokens=1)))
    assert llm.requests == []  # rejected before submission
    with pytest.raises(EngineError, match="RuntimeError: boom"):
        asyncio.run(engine.generate(GenerationRequest(prompt="a", max_tokens=13)))
    assert asyncio.run(engine.generate(GenerationRequest(prompt="a", max_tokens=2))).text == "1 tokens"
    asyncio.run(engine.close())
    assert llm.shut and not engine._loop.thread.is_alive()


def test_auto_dtype_is_float32_on_a_cpu_without_native_bfloat16(monkeypatch):
    from raypipe.llm import common

    monkeypatch.setattr(common, "cpu_has_native_bf16", lambda: False)
    assert common.resolve_dtype("auto", on_cpu=True) == "float32"
    assert _vllm().engine_kwargs(EngineConfig(dtype="auto"), "/m", on_cpu=True)["dtype"] == "float32"
    monkeypatch.setattr(common, "cpu_has_native_bf16", lambda: True)
    assert common.resolve_dtype("auto", on_cpu=True) == "bfloat16"
    assert common.resolve_dtype("auto", on_cpu=False) == "auto"  # a GPU: the model's own dtype
    assert common.resolve_dtype("bfloat16", on_cpu=True) == "bfloat16"  # an explicit choice is kept

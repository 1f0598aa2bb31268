"""The engine levers (chunked prefill, the scheduler's token budget, n-gram speculative decoding): typed settings
of EngineConfig, passed to vLLM only when set, so every preset builds the engine arguments it built before."""

import dataclasses

import pytest
from pydantic import ValidationError

from raypipe.core.config import ConfigError, EngineConfig, known_presets, load_config

LEVER_KEYS = {"max_num_batched_tokens", "enable_chunked_prefill", "speculative_config"}
# engine_kwargs' keys before the levers existed, for every preset: the common ones, the device's, the preset's own
COMMON_KEYS = {
    "model",
    "tokenizer",
    "dtype",
    "max_model_len",
    "tensor_parallel_size",
    "enable_prefix_caching",
    "seed",
    "enforce_eager",
    "structured_outputs_config",
    "disable_log_stats",
}
DEVICE_KEYS = {True: {"kv_cache_memory_bytes"}, False: {"gpu_memory_utilization"}}
PRESET_KEYS = {
    "embedded": {"block_size"},
    "embedded-untuned": {"block_size"},
    "r1searcher": {"block_size"},
    "r1searcher-7b-gpu": {"block_size"},
    "searchr1-7b-gpu": {"block_size"},
}


def engine_kwargs(config: EngineConfig, on_cpu: bool = True) -> dict:
    return pytest.importorskip("raypipe.llm.vllm_engine").engine_kwargs(config, "/m", on_cpu=on_cpu)


@pytest.mark.parametrize("on_cpu", [True, False])
def test_no_lever_is_passed_by_default(on_cpu):
    assert not LEVER_KEYS & engine_kwargs(EngineConfig(), on_cpu).keys()


def test_each_lever_is_passed_alone_under_vllms_name():
    assert engine_kwargs(EngineConfig(max_num_batched_tokens=8192)).keys() & LEVER_KEYS == {"max_num_batched_tokens"}
    assert engine_kwargs(EngineConfig(max_num_batched_tokens=8192))["max_num_batched_tokens"] == 8192
    chunked = engine_kwargs(EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096))
    assert chunked["enable_chunked_prefill"] is False  # False is a setting, not "unset"
    assert "enable_chunked_prefill" not in engine_kwargs(EngineConfig(enable_chunked_prefill=None))
    speculative = engine_kwargs(EngineConfig(speculative_ngram_tokens=3))
    assert speculative.keys() & LEVER_KEYS == {"speculative_config"}
    assert speculative["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    window = engine_kwargs(EngineConfig(speculative_ngram_tokens=5, speculative_ngram_max=6, speculative_ngram_min=6))
    lookup = window["speculative_config"]
    assert (lookup["num_speculative_tokens"], lookup["prompt_lookup_max"], lookup["prompt_lookup_min"]) == (5, 6, 6)


def test_the_ngram_window_alone_does_not_turn_speculation_on():
    assert "speculative_config" not in engine_kwargs(EngineConfig(speculative_ngram_max=8, speculative_ngram_min=1))


@pytest.mark.parametrize("on_cpu", [True, False])
def test_every_argument_is_one_vllm_accepts(on_cpu):
    """The names are vLLM's: AsyncEngineArgs' fields and, inside speculative_config, SpeculativeConfig's."""
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    from vllm.config import SpeculativeConfig

    everything = EngineConfig(
        max_num_seqs=8, max_num_batched_tokens=8192, enable_chunked_prefill=True, speculative_ngram_tokens=3
    )
    kwargs = engine_kwargs(everything, on_cpu)
    assert LEVER_KEYS <= kwargs.keys()
    assert kwargs.keys() <= {f.name for f in dataclasses.fields(arg_utils.AsyncEngineArgs)}
    assert kwargs["speculative_config"].keys() <= {f.name for f in dataclasses.fields(SpeculativeConfig)}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"speculative_ngram_tokens": 0}, "speculative_ngram_tokens"),
        ({"speculative_ngram_max": 0}, "speculative_ngram_max"),
        ({"speculative_ngram_min": 0}, "speculative_ngram_min"),
        ({"speculative_ngram_min": 5, "speculative_ngram_max": 4}, "speculative_ngram_min=5 must be <= .*max=4"),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}, "2048 < max_model_len=4096 without"),
        ({"enable_chunked_prefill": "sometimes"}, "enable_chunked_prefill"),
    ],
)
def test_the_config_rejects_nonsense(settings, message):
    with pytest.raises(ValidationError, match=message):
        EngineConfig(**settings)


def test_a_budget_that_holds_the_context_needs_no_chunked_prefill():
    config = EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=4096)
    assert engine_kwargs(config)["max_num_batched_tokens"] == 4096
    with pytest.raises(ValidationError, match="max_model_len=8192"):
        config.max_model_len = 8192  # checked on assignment too (the benchmarks raise the context)


def test_levers_are_set_from_the_command_line_and_recorded_in_the_config():
    config = load_config("embedded", ["engine.speculative_ngram_tokens=3", "engine.max_num_batched_tokens=4096"])
    dumped = config.model_dump()["engine"]
    assert (dumped["speculative_ngram_tokens"], dumped["max_num_batched_tokens"]) == (3, 4096)
    assert dumped["enable_chunked_prefill"] is None
    with pytest.raises(ConfigError, match="speculative_ngram_tokens"):
        load_config("embedded", ["engine.speculative_ngram_tokens=-1"])


def test_every_shipped_preset_has_its_expected_keys_listed():
    assert set(known_presets()) == PRESET_KEYS.keys(), "a new preset: list its engine_kwargs keys in PRESET_KEYS"


@pytest.mark.parametrize("preset", sorted(PRESET_KEYS))
@pytest.mark.parametrize("on_cpu", [True, False])
def test_every_preset_builds_the_engine_arguments_it_built_before(preset, on_cpu):
    kwargs = engine_kwargs(load_config(preset).engine, on_cpu)
    assert kwargs.keys() == COMMON_KEYS | DEVICE_KEYS[on_cpu] | PRESET_KEYS[preset]

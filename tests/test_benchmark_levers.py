"""benchmarks/levers.py: every lever is a valid raypipe setting that reaches vLLM's engine arguments."""

from __future__ import annotations

import pytest

from raypipe.core.config import DEFAULT_PRESET, load_config
from tests.helpers.benchmarks import imported_benchmark


@pytest.fixture(scope="module")
def levers():
    """benchmarks/levers.py, imported by path with benchmarks/ importable (it imports probe.py beside it)."""
    with imported_benchmark("levers") as module:
        yield module


def engine_args(settings):
    from raypipe.llm.vllm_engine import engine_kwargs

    config = load_config(DEFAULT_PRESET, list(settings))
    return config.engine, engine_kwargs(config.engine, "/model", on_cpu=True)


def test_every_lever_changes_the_engine_it_names(levers):
    pytest.importorskip("vllm")
    default, default_args = engine_args(levers.LEVERS[levers.DEFAULT])
    for name, settings in levers.LEVERS.items():
        if name == levers.DEFAULT:
            continue
        engine, args = engine_args(settings)
        assert engine != default, f"{name} changes no engine setting"
        if name not in ("vllm-threads", "float32"):  # both reach vLLM through the environment / the dtype
            assert args != default_args, f"{name} does not reach vLLM's engine arguments"
    _, together = engine_args(levers.LEVERS["together"])
    assert together["speculative_config"]["num_speculative_tokens"] == 4
    assert (together["max_num_batched_tokens"], together["block_size"], together["max_num_seqs"]) == (4096, 64, 16)
    assert together["enforce_eager"] is False and "enable_chunked_prefill" not in together
    threads, _ = engine_args(levers.LEVERS["vllm-threads"])
    assert threads.cpu_threads is None and default.cpu_threads == "all"

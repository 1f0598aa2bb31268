"""End to end with the real engine and retriever: jobs/probe.py on 3 questions; vLLM trajectories equal
transformers'."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypipe.agents import build_loop, build_protocol
from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import load_questions

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_corpus(paragraph_corpus):
    """The paragraphs of the first 3 HotpotQA questions."""
    return paragraph_corpus(("hotpotqa",), 3)


def test_main_job_on_three_questions(tmp_path, small_corpus):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "jobs" / "probe.py"),
        "--dataset",
        "hotpotqa",
        "--limit",
        "3",
        "--out",
        str(out),
        "--set",
        "agent.max_turns=2",
        "--set",
        "agent.max_new_tokens=96",
        "--set",
        "ray.num_cpus=2",
        # the first-turn grammar (think, then search) must be completable within the 96 new tokens
        "--set",
        "agent.enforce_think_chars=150",
        "--set",
        f"data.corpus={small_corpus}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 new trajectories" in proc.stdout and "hotpotqa" in proc.stdout and "P_0" in proc.stdout
    # not a terminal: Ray Data's progress goes to the run's log, raypipe's own line to the terminal
    assert "Running Dataset" in (out / "logs" / "ray_data.log").read_text()
    assert "Running Dataset" not in proc.stderr and "3/3 trajectories" in proc.stderr
    run = RunDir(out)
    trajectories, iterations = run.read("trajectories"), run.read("iterations")
    assert trajectories.num_rows == 3
    assert set(iterations.column("iteration").to_pylist()) >= {0}
    assert all(f is not None for f in iterations.column("probe_f1").to_pylist())  # every iteration probed
    assert sum(n >= 1 for n in trajectories.column("n_iterations").to_pylist()) >= 2  # first_search enforcement
    # a rerun writes nothing new
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0 and "0 new trajectories" in again.stdout
    assert run.read("trajectories").sort_by("qid").equals(trajectories.sort_by("qid"))


def test_vllm_trajectories_equal_transformers_float32(small_corpus):
    from raypipe.llm.factory import build_engine
    from raypipe.retrieval import LocalRetriever, encoder_spec, search_params
    from raypipe.runtime.index_build import ensure_index

    config = load_config(
        "embedded",
        [
            "engine.dtype=float32",
            "agent.enforcement=none",
            "agent.max_turns=2",
            "agent.max_new_tokens=48",
            "agent.probe_max_tokens=16",
            f"data.corpus={small_corpus}",
        ],
    )
    questions = load_questions("hotpotqa", limit=2)
    retriever = LocalRetriever.open(
        ensure_index(config, use_ray=False), encoder_spec(config.retrieval), search_params(config.retrieval)
    )
    protocol = build_protocol(config.agent)

    def transcripts(backend):
        cfg = config.model_copy(deep=True)
        cfg.engine.backend = backend
        engine = build_engine(cfg.engine)
        loop = build_loop(cfg, engine, retriever, protocol)

        async def go():
            outs = [await loop.run(q) for q in questions]
            await engine.close()
            return outs

        return asyncio.run(go())

    fast, slow = transcripts("vllm"), transcripts("transformers")
    for v, h in zip(fast, slow):
        assert v.trajectory["transcript"] == h.trajectory["transcript"]
        assert [r["probe_answer"] for r in v.iterations] == [r["probe_answer"] for r in h.iterations]
        assert v.trajectory["stop_reason"] == h.trajectory["stop_reason"]

"""Where the stages' work runs, on a local Ray with fake GPUs (Ray resources only; torch stays on the CPU):
Stop-RAG's engines in a generation-placed actor, not the driver (issue 40, finding 5)."""

from __future__ import annotations

import os

import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from raypipe.core.config import load_config  # noqa: E402
from raypipe.llm.base import GenerationRequest  # noqa: E402
from raypipe.testing.fakes import FakeEngine  # noqa: E402
from tests.helpers.runs import write_stoprag_run  # noqa: E402

FAKE_GPUS = 2


@pytest.fixture(scope="module")
def ray_fake_gpus():
    """A local Ray with 2 CPUs, 2 fake GPUs and a generation node's custom resource."""
    from tests.helpers.local_ray import ship_tests_by_value

    ship_tests_by_value()
    ray.init(num_cpus=2, num_gpus=FAKE_GPUS, resources={"raypipe_generation": 1}, object_store_memory=300_000_000,
             include_dashboard=False, log_to_driver=False)  # fmt: skip
    yield ray
    ray.shutdown()


def where_am_i(request: GenerationRequest) -> str:
    """A verdict that also says which process answered and which GPUs Ray gave it."""
    import ray as ray_in_engine

    gpus = ",".join(str(g) for g in ray_in_engine.get_gpu_ids()) if ray_in_engine.is_initialized() else ""
    return f"<STOP> pid={os.getpid()} gpus=[{gpus}] cuda={os.environ.get('CUDA_VISIBLE_DEVICES')}"


def placed_engine(engine_config) -> FakeEngine:
    return FakeEngine(where_am_i)


def stoprag_without_training(run, config, monkeypatch):
    """``run_stoprag`` with the Q-network's training left out (it is not what these tests are about)."""
    from raypipe.stages import stoprag

    monkeypatch.setattr(stoprag, "stoprag_controllers", lambda *args: {})
    return stoprag.run_stoprag(run, config, llm_stop=True, engine_factory=placed_engine)


def answered_by(path) -> set[tuple[str, str, str]]:
    """(pid, gpus, cuda) of every answer in an outputs table."""
    column = "output" if "output" in pd.read_parquet(path).columns else "answer"
    out = set()
    for text in pd.read_parquet(path)[column]:
        pid, gpus, cuda = (part.split("=", 1)[1] for part in text.split()[1:4])
        out.add((pid, gpus, cuda))
    return out


def test_llm_stop_calls_its_engine_in_an_actor_on_the_cpu_by_default(tmp_path, ray_fake_gpus, monkeypatch):
    run = write_stoprag_run(tmp_path / "run", n_questions=20)
    config = load_config(overrides=["stoprag.split=[0.5,0.25,0.25]", "stoprag.llm_stop_max_questions=3"])
    assert config.generation.actor_num_gpus == 0
    stoprag_without_training(run, config, monkeypatch)
    (pid, gpus, _), = answered_by(run.path / "stoprag" / "llm_stop.parquet")
    assert pid != str(os.getpid())  # the driver built no engine
    assert gpus == "[]"  # the local default: a CPU actor


def test_stoprag_engines_run_in_an_actor_holding_a_gpu(tmp_path, ray_fake_gpus, monkeypatch):
    run = write_stoprag_run(tmp_path / "run", n_questions=20)
    config = load_config(overrides=[
        "stoprag.split=[0.5,0.25,0.25]", "stoprag.llm_stop_max_questions=3", "stoprag.reward_source=generator",
        "stoprag.reward_samples=1", "generation.actor_num_gpus=1", "generation.resources={raypipe_generation: 1}",
    ])  # fmt: skip
    stoprag_without_training(run, config, monkeypatch)
    for table in ("llm_stop.parquet", "rewards.parquet"):  # LLM-Stop and the reward generator
        (pid, gpus, cuda), = answered_by(run.path / "stoprag" / table)
        assert pid != str(os.getpid()), table
        assert len(gpus.strip("[]").split(",")) == 1 and gpus != "[]", table
        assert cuda == gpus.strip("[]"), table
    assert not ray.get_gpu_ids()

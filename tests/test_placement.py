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
    ray.init(
        num_cpus=2,
        num_gpus=FAKE_GPUS,
        resources={"raypipe_generation": 1},
        object_store_memory=300_000_000,
        include_dashboard=False,
        log_to_driver=False,
    )
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
    ((pid, gpus, _),) = answered_by(run.path / "stoprag" / "llm_stop.parquet")
    assert pid != str(os.getpid())  # the driver built no engine
    assert gpus == "[]"  # the local default: a CPU actor


def test_stoprag_engines_run_in_an_actor_holding_a_gpu(tmp_path, ray_fake_gpus, monkeypatch):
    run = write_stoprag_run(tmp_path / "run", n_questions=20)
    config = load_config(
        overrides=[
            "stoprag.split=[0.5,0.25,0.25]",
            "stoprag.llm_stop_max_questions=3",
            "stoprag.reward_source=generator",
            "stoprag.reward_samples=1",
            "generation.actor_num_gpus=1",
            "generation.resources={raypipe_generation: 1}",
        ]
    )
    stoprag_without_training(run, config, monkeypatch)
    for table in ("llm_stop.parquet", "rewards.parquet"):  # LLM-Stop and the reward generator
        ((pid, gpus, cuda),) = answered_by(run.path / "stoprag" / table)
        assert pid != str(os.getpid()), table
        assert len(gpus.strip("[]").split(",")) == 1 and gpus != "[]", table
        assert cuda == gpus.strip("[]"), table
    assert not ray.get_gpu_ids()


# ---------------------------------------------------------------- Ray Train workers on GPUs, storage elsewhere


class _OneStep:
    """A Training of one epoch: a DDP step of a tiny model, each worker's GPUs and device written to ``record``."""

    def __init__(self, record: str, worker):
        import torch

        self.worker, self.record = worker, record
        self.model = worker.prepare_model(torch.nn.Linear(2, 1))

    def resume(self, folder):
        raise AssertionError("nothing to resume")

    def epochs(self):
        import torch

        from raypipe.core.training import EpochEnd

        loss = self.model(torch.ones(4, 2, device=self.worker.device)).sum()
        loss.backward()  # DDP's all-reduce over the workers' process group
        gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        with open(os.path.join(self.record, f"rank{self.worker.rank}"), "w") as fh:
            fh.write(f"{gpus} {self.worker.device} {os.environ.get('CUDA_VISIBLE_DEVICES')}")
        yield EpochEnd({"loss": float(loss)}, lambda folder: (folder / "weights.txt").write_text("w"), "e1")


def one_step_loop(config: dict) -> None:
    from functools import partial

    from raypipe.runtime.trainer import run_training

    run_training(partial(_OneStep, config["record"]), seed=0)


def test_train_workers_hold_one_gpu_each_and_checkpoint_into_ray_storage_path(tmp_path, ray_fake_gpus, monkeypatch):
    from raypipe.runtime.trainer import SIMULATED_GPUS, storage_location, torch_trainer

    monkeypatch.setenv(SIMULATED_GPUS, "1")  # the fake GPUs are Ray resources only: torch trains on the CPU
    config = load_config(overrides=[f"ray.storage_path={tmp_path / 'shared' / 'train'}"])
    storage = storage_location(config.ray.storage_path, tmp_path / "run", "stoprag/ray_train")
    (tmp_path / "record").mkdir()
    trainer = torch_trainer(
        one_step_loop,
        {"record": str(tmp_path / "record")},
        name="q",
        storage=storage,
        num_workers=FAKE_GPUS,
        use_gpu=True,
        cpus_per_worker=0.5,
        keep=1,
    )
    result = trainer.fit()
    held = sorted((tmp_path / "record" / f"rank{r}").read_text().split() for r in range(FAKE_GPUS))
    assert [gpus for gpus, _, _ in held] == ["0", "1"]  # one GPU each, not the same one
    assert all(device == "cpu" for _, device, _ in held)
    checkpoint = tmp_path / "shared" / "train" / "run" / "stoprag" / "ray_train" / "q"
    assert result.checkpoint.path.startswith(str(checkpoint))
    assert (checkpoint / "e1" / "weights.txt").read_text() == "w"
    assert not (tmp_path / "run").exists()  # nothing in the run directory


def test_a_gpu_worker_whose_torch_sees_no_cuda_fails_with_one_line(tmp_path, ray_fake_gpus, monkeypatch):
    from raypipe.runtime.trainer import SIMULATED_GPUS, torch_trainer

    monkeypatch.delenv(SIMULATED_GPUS, raising=False)
    with pytest.raises(RuntimeError, match=r"holds GPU \d \(use_gpu\) but torch sees no CUDA device: install the GPU"):
        torch_trainer(
            one_step_loop, {}, name="q", storage=tmp_path, num_workers=1, use_gpu=True, cpus_per_worker=0.5, keep=1
        )


def test_storage_follows_the_run_directory_or_ray_storage_path(tmp_path):
    from raypipe.runtime.trainer import storage_location

    run = tmp_path / "runs" / "r1"
    assert storage_location(None, run, "stopping/tune") == str((run / "stopping" / "tune").resolve())
    assert storage_location("/mnt/raypipe/train", run, "stopping/tune") == "/mnt/raypipe/train/r1/stopping/tune"
    assert storage_location("s3://bucket/train/", run, "models/ray_train") == "s3://bucket/train/r1/models/ray_train"
    with pytest.raises(ValueError, match="ray.storage_path='train': give an absolute path"):
        load_config(overrides=["ray.storage_path=train"])


class Built(Exception):
    """Raised by the stand-in trainer: what the stage asked for is recorded, nothing trains."""


def test_stoprag_trains_into_ray_storage_path(tmp_path, monkeypatch):
    from raypipe.stages import stoprag

    asked = {}

    def record(loop, loop_config, **settings):
        asked.update(settings)
        raise Built

    monkeypatch.setattr(stoprag, "torch_trainer", record)
    run = write_stoprag_run(tmp_path / "run", n_questions=20)
    config = load_config(
        overrides=[
            "stoprag.split=[0.5,0.25,0.25]",
            "stoprag.max_length=64",
            "stoprag.use_gpu=true",
            f"ray.storage_path={tmp_path / 'shared'}",
        ]
    )
    with pytest.raises(Built):
        stoprag.run_stoprag(run, config, llm_stop=False)
    assert asked["storage"] == str(tmp_path / "shared" / "run" / "stoprag" / "ray_train") and asked["use_gpu"]


@pytest.mark.parametrize("preset", ["searchr1-7b-gpu", "r1searcher-7b-gpu"])
def test_gpu_presets_keep_runs_index_and_training_on_the_shared_mount(preset):
    from raypipe.runtime.trainer import storage_location

    config = load_config(preset)
    assert config.runs_dir == "/mnt/raypipe/runs"
    assert config.retrieval.index.dir.startswith("/mnt/raypipe/index/")
    assert (
        storage_location(config.ray.storage_path, "/mnt/raypipe/runs/x", "stoprag/ray_train")
        == "/mnt/raypipe/train/x/stoprag/ray_train"
    )
    gen = config.generation  # where LLM-Stop's engine runs: a generation node's GPU
    assert gen.actor_num_gpus == 1 and gen.resources == {"raypipe_generation": 1}
    assert config.train.use_gpu and config.stoprag.use_gpu


def test_train_and_sweep_stages_pass_ray_storage_path_on(tmp_path, monkeypatch):
    import argparse

    from raypipe.core.rundir import RunDir
    from raypipe.runtime.stage_main import StageRun
    from raypipe.stages import sweep, train

    asked = {}
    monkeypatch.setattr(
        train, "run_train", lambda *args, trainer, **kw: asked.update(train=trainer.keywords["storage"])
    )
    monkeypatch.setattr(sweep, "run_sweep", lambda *args, storage, **kw: asked.update(sweep=storage))
    config = load_config(overrides=["ray.storage_path=s3://bucket/train"])
    stage = StageRun(argparse.Namespace(), RunDir(tmp_path / "r7"), config)
    train._train(stage)
    sweep._sweep(stage)
    assert asked == {"train": "s3://bucket/train/r7/models/ray_train", "sweep": "s3://bucket/train/r7/stopping/tune"}

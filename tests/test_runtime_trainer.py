"""The TorchTrainer set-up both training jobs share (built, not run: no Ray cluster needed)."""

import os
from pathlib import Path

import pytest

pytest.importorskip("ray.train")

from raypipe.runtime import trainer

TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


def test_torch_trainer_settings_and_worker_start_timeout(tmp_path, monkeypatch):
    monkeypatch.delenv(TIMEOUT, raising=False)
    built = trainer.torch_trainer(
        print,
        {"x": 1},
        name="job",
        storage=tmp_path,
        num_workers=2,
        use_gpu=False,
        cpus_per_worker=1.5,
        keep=3,
        score_attribute="keep_score",
    )
    assert built.train_loop_config == {"x": 1}
    assert built.scaling_config.num_workers == 2 and built.scaling_config.resources_per_worker == {"CPU": 1.5}
    run = built.run_config
    assert run.name == "job" and run.storage_path == str(tmp_path)
    assert run.checkpoint_config.num_to_keep == 3 and run.checkpoint_config.checkpoint_score_attribute == "keep_score"
    assert run.failure_config.max_failures == trainer.MAX_FAILURES
    assert os.environ[TIMEOUT] == trainer.WORKER_GROUP_START_TIMEOUT_S
    monkeypatch.setenv(TIMEOUT, "30")  # a timeout set by the user wins
    trainer.torch_trainer(
        print, {}, name="job", storage=tmp_path, num_workers=1, use_gpu=False, cpus_per_worker=1, keep=1
    )
    assert os.environ[TIMEOUT] == "30"


class Built(Exception):
    """Raised by the stand-in helper: the job's trainer was built, nothing runs."""


def test_both_training_jobs_build_their_trainer_with_the_helper(tmp_path, monkeypatch):
    from raypipe.core.config import StopRagConfig, TrainConfig
    from raypipe.predict.crossencoder import Task
    from raypipe.stages import stoprag, train
    from raypipe.stoprag.targets import Sample

    calls = []

    def record(loop, loop_config, **settings):
        calls.append((loop, settings))
        raise Built

    for stage in (train, stoprag):
        monkeypatch.setattr(stage, "torch_trainer", record)
    with pytest.raises(Built):
        tasks = [Task("intra_iteration_p_fold0", "intra_iteration", ["a", "b", "c", "d"], [0.0, 1.0, 0.0, 1.0])]
        train.train_crossencoders(tasks, TrainConfig(num_workers=2, cpus_per_worker=1.5), tmp_path)
    with pytest.raises(Built):
        stoprag.train_qnetwork(
            ["s"],
            [Sample(0, 1.0, (0.0,), ())],
            StopRagConfig(num_workers=3, cpus_per_worker=0.5, max_length=256),
            "encoder",
            tmp_path / "qnet",
        )
    (ce_loop, ce), (q_loop, q) = calls
    assert ce_loop is train.train_loop_per_worker and q_loop is stoprag.train_loop
    assert (ce["num_workers"], ce["cpus_per_worker"], ce["keep"], ce["score_attribute"]) == (2, 1.5, 2, "keep_score")
    assert (q["num_workers"], q["cpus_per_worker"], q["keep"]) == (3, 0.5, 1)


class _Epochs:
    """A Training that records what the worker loop did with it; its checkpoint is one file."""

    def __init__(self, worker):
        import torch

        self.worker, self.first_draw, self.resumed_from = worker, torch.rand(1).item(), None

    def resume(self, folder):
        self.resumed_from = (folder / "epoch.txt").read_text()

    def epochs(self):
        from raypipe.core.training import EpochEnd

        for epoch in (1, 2):
            save = lambda folder, e=epoch: (folder / "epoch.txt").write_text(str(e))  # noqa: E731
            yield EpochEnd({"epoch": epoch}, save, f"e{epoch}")


@pytest.mark.parametrize("rank", [0, 1])
def test_run_training_seeds_resumes_and_reports_every_epoch_with_rank_0s_checkpoint(rank, tmp_path, monkeypatch):
    """The worker loop's wiring, with Ray Train's worker calls stood in for (no cluster)."""
    import ray.train
    import ray.train.torch
    import torch

    class Context:
        def get_world_rank(self):
            return rank

        def get_world_size(self):
            return 2

    (tmp_path / "epoch.txt").write_text("1")
    reports, threads, built = [], [], []

    def report(metrics, checkpoint=None, checkpoint_dir_name=None):
        saved = (Path(checkpoint.path) / "epoch.txt").read_text() if checkpoint is not None else None
        reports.append((metrics, saved, checkpoint_dir_name))

    monkeypatch.setattr(ray.train, "get_context", Context)
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: ray.train.Checkpoint.from_directory(str(tmp_path)))
    monkeypatch.setattr(ray.train, "report", report)
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch, "set_num_threads", threads.append)

    def build(worker):
        built.append(_Epochs(worker))
        return built[-1]

    trainer.run_training(build, seed=7, threads=3)
    (training,) = built
    torch.manual_seed(7)
    assert training.first_draw == torch.rand(1).item() and threads == [3]
    assert (training.worker.rank, training.worker.world) == (rank, 2) and training.resumed_from == "1"
    if rank == 0:
        assert reports == [({"epoch": 1}, "1", "e1"), ({"epoch": 2}, "2", "e2")]
    else:
        assert reports == [({"epoch": 1}, None, None), ({"epoch": 2}, None, None)]

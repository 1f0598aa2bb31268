"""Ray Train for the training jobs (the cross-encoders of ``train``, the Q-network of ``stoprag``), written once.

- :func:`torch_trainer`: data-parallel workers with a CPU share each, the run's checkpoints under
  ``storage/name``, a worker group restarted up to ``max_failures`` times (the loop resumes from its last
  checkpoint), and a worker group start timeout long enough for a busy machine.
- :func:`run_training`: the body of every worker loop. It runs a Ray-free
  :class:`~raypipe.core.training.Training` (the model's own steps, in its domain package) on a
  :class:`RayWorker`: threads and seed, resume from ``ray.train.get_checkpoint()``, and after every epoch
  rank 0's checkpoint folder and every worker's ``ray.train.report``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raypipe.core.training import EpochEnd, Training, Worker

# Ray Train gives a worker group 60 s to start; a busy 2-core machine can need several minutes
WORKER_GROUP_START_TIMEOUT_S = "900"
MAX_FAILURES = 2  # worker group restarts before a training run gives up


def torch_trainer(
    loop: Callable[[dict[str, Any]], None],
    loop_config: dict[str, Any],
    *,
    name: str,
    storage: Path,
    num_workers: int,
    use_gpu: bool,
    cpus_per_worker: float,
    max_failures: int = MAX_FAILURES,
    keep: int,
    score_attribute: str | None = None,
):
    """A TorchTrainer running ``loop(loop_config)`` on every worker; ``keep`` checkpoints survive (the best
    by ``score_attribute``, else the latest). A timeout already set in the environment wins."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", WORKER_GROUP_START_TIMEOUT_S)
    return TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}
        ),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=keep, checkpoint_score_attribute=score_attribute),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )


@dataclass(frozen=True)
class RayWorker:
    """A Ray Train worker as a :class:`~raypipe.core.training.Worker`: DDP and sharded loaders from Ray Train."""

    rank: int
    world: int
    device: Any

    def prepare_model(self, model: Any, *, find_unused_parameters: bool = False) -> Any:
        import ray.train.torch

        ddp = {"find_unused_parameters": True} if find_unused_parameters else None
        return ray.train.torch.prepare_model(model, parallel_strategy_kwargs=ddp)

    def prepare_loader(self, loader: Any) -> Any:
        import ray.train.torch

        return ray.train.torch.prepare_data_loader(loader, move_to_device=False)


def run_training(build: Callable[[Worker], Training], *, seed: int, threads: int = 0) -> None:
    """Inside a Ray Train worker: ``threads`` torch threads (0: torch's default), ``torch.manual_seed(seed)``,
    then ``build(worker)``, resumed from the run's last checkpoint when Ray Train restarted the workers after a
    failure, trained epoch by epoch, every epoch reported (rank 0 with its checkpoint)."""
    import ray.train
    import ray.train.torch
    import torch

    ctx = ray.train.get_context()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    worker = RayWorker(ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device())
    training = build(worker)
    resumed = ray.train.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as folder:
            training.resume(Path(folder))
    for end in training.epochs():
        _report(end, worker.rank)


def _report(end: EpochEnd, rank: int) -> None:
    """Report an epoch; rank 0 attaches the checkpoint (the other workers hold the same model)."""
    import ray.train

    if rank != 0:
        ray.train.report(end.metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        end.save(Path(tmp))
        ray.train.report(end.metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp), checkpoint_dir_name=end.name)

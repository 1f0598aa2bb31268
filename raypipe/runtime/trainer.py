"""Ray Train for the training jobs (the cross-encoders of ``train``, the Q-network of ``stoprag``), written once.

- :func:`storage_location`: where a stage's Ray Train or Tune runs live: inside the run directory
  (``ray.storage_path`` None) or under ``ray.storage_path`` (a shared mount or an s3:// / gs:// URI);
  :func:`clear_storage` removes a run from either.
- :func:`torch_trainer`: data-parallel workers with a CPU share each (and one GPU each with ``use_gpu``), the
  run's checkpoints under ``storage/name``, a worker group restarted up to ``max_failures`` times (the loop
  resumes from its last checkpoint), and a worker group start timeout long enough for a busy machine.
- :func:`run_training`: the body of every worker loop. It runs a Ray-free
  :class:`~raypipe.core.training.Training` (the model's own steps, in its domain package) on a
  :class:`RayWorker`: threads and seed, resume from ``ray.train.get_checkpoint()``, and after every epoch
  rank 0's checkpoint folder and every worker's ``ray.train.report``.

A worker that holds a GPU trains on it (:func:`worker_device`); one whose node shows no CUDA device fails with
one line, except on the simulated cluster of the tests (``RAYPIPE_SIMULATED_GPUS=1`` in the driver's
environment: GPUs that are Ray resources only, a CPU build of torch), where it trains on the CPU and the
workers' process group uses gloo instead of NCCL.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from raypipe.core.training import EpochEnd, Training, Worker

SIMULATED_GPUS = "RAYPIPE_SIMULATED_GPUS"  # "1": GPUs are Ray resources only (the simulated cluster's tests)
# Ray Train gives a worker group 60 s to start; a busy 2-core machine can need several minutes
WORKER_GROUP_START_TIMEOUT_S = "900"
MAX_FAILURES = 2  # worker group restarts before a training run gives up
GPU_CHECK_TIMEOUT_S = 60.0  # the wait for a GPU to check torch's CUDA on (check_gpu_torch)


def is_uri(location: str | Path) -> bool:
    """Whether a storage location is a URI (s3://, gs://, ...) rather than a path."""
    return "://" in str(location)


def storage_location(storage_path: str | None, run_path: Path, folder: str) -> str:
    """Where a stage keeps its Ray Train or Tune runs: ``run_path/folder`` when ``storage_path``
    (``ray.storage_path``) is None, else ``storage_path/<run directory's name>/folder``."""
    if storage_path is None:
        return str((Path(run_path) / folder).resolve())
    if is_uri(storage_path):
        return f"{storage_path.rstrip('/')}/{Path(run_path).resolve().name}/{folder}"
    return str(Path(storage_path).expanduser() / Path(run_path).resolve().name / folder)


def clear_storage(location: str) -> None:
    """Remove a folder of a storage location (a path or a URI), if it is there."""
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(location if is_uri(location) else str(Path(location).resolve()))
    if filesystem.get_file_info(path).type != fs.FileType.NotFound:
        filesystem.delete_dir(path)


def simulated_gpus() -> bool:
    """Whether this process runs on the simulated cluster, whose GPUs are Ray resources only."""
    return os.environ.get(SIMULATED_GPUS) == "1"


def torch_trainer(
    loop: Callable[[dict[str, Any]], None],
    loop_config: dict[str, Any],
    *,
    name: str,
    storage: str | Path,
    num_workers: int,
    use_gpu: bool,
    cpus_per_worker: float,
    max_failures: int = MAX_FAILURES,
    keep: int,
    score_attribute: str | None = None,
):
    """A TorchTrainer running ``loop(loop_config)`` on every worker (one GPU each with ``use_gpu``), its runs
    under ``storage`` (a path or a URI, :func:`storage_location`); ``keep`` checkpoints survive (the best by
    ``score_attribute``, else the latest). A timeout already set in the environment wins."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", WORKER_GROUP_START_TIMEOUT_S)
    simulated = use_gpu and simulated_gpus()
    if use_gpu and not simulated:
        check_gpu_torch()
    per_worker = {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    return TorchTrainer(
        partial(_worker_loop, loop, simulated) if simulated else loop,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="gloo") if simulated else None,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=per_worker),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage) if is_uri(storage) else str(Path(storage).resolve()),
            checkpoint_config=CheckpointConfig(num_to_keep=keep, checkpoint_score_attribute=score_attribute),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )


def check_gpu_torch(timeout_s: float = GPU_CHECK_TIMEOUT_S) -> None:
    """Before a ``use_gpu`` run (Ray initialised): a task holding one GPU checks that torch sees a CUDA device
    there, so a GPU node without the GPU stack fails with one line, not in NCCL's set-up; no answer within
    ``timeout_s`` (every GPU busy) skips the check."""
    import ray
    from ray.exceptions import GetTimeoutError

    ref = ray.remote(num_cpus=0, num_gpus=1, max_retries=0)(_gpu_and_cuda).remote()
    try:
        gpu_ids, cuda_available = ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        ray.cancel(ref, force=True)
        return
    worker_device(gpu_ids, cuda_available, simulated=False)


def _gpu_and_cuda() -> tuple[list, bool]:
    import ray
    import torch

    return ray.get_gpu_ids(), torch.cuda.is_available()


def _worker_loop(loop: Callable[[dict[str, Any]], None], simulated: bool, config: dict[str, Any]) -> None:
    """``loop(config)`` in a worker that knows whether its GPUs are simulated (the driver's setting)."""
    if simulated:
        os.environ[SIMULATED_GPUS] = "1"
    loop(config)


def worker_device(gpu_ids: list, cuda_available: bool, simulated: bool) -> str:
    """The device of a Ray Train worker that Ray gave ``gpu_ids``: ``cuda`` where torch sees CUDA, ``cpu``
    without GPUs or on the simulated cluster; a worker holding a GPU its torch cannot see fails with one line."""
    if not gpu_ids:
        return "cpu"
    if cuda_available:
        return "cuda"
    if simulated:
        return "cpu"
    raise RuntimeError(
        f"this Ray Train worker holds GPU {','.join(map(str, gpu_ids))} (use_gpu) but torch sees no CUDA device: "
        "install the GPU stack on the GPU nodes (scripts/install.sh VENV gpu), or train with use_gpu=false"
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
        return ray.train.torch.prepare_model(model, move_to_device=self.device, parallel_strategy_kwargs=ddp)

    def prepare_loader(self, loader: Any) -> Any:
        import ray.train.torch

        return ray.train.torch.prepare_data_loader(loader, move_to_device=False)


def run_training(build: Callable[[Worker], Training], *, seed: int, threads: int = 0) -> None:
    """Inside a Ray Train worker: ``threads`` torch threads (0: torch's default), ``torch.manual_seed(seed)``,
    then ``build(worker)``, resumed from the run's last checkpoint when Ray Train restarted the workers after a
    failure, trained epoch by epoch, every epoch reported (rank 0 with its checkpoint)."""
    import ray
    import ray.train
    import ray.train.torch
    import torch

    ctx = ray.train.get_context()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []  # a Train worker has joined Ray; a test calls it bare
    device = worker_device(gpu_ids, torch.cuda.is_available(), simulated_gpus())
    worker = RayWorker(
        ctx.get_world_rank(),
        ctx.get_world_size(),
        ray.train.torch.get_device() if device == "cuda" else torch.device("cpu"),
    )
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

"""The TorchTrainer of the training jobs (the cross-encoders of ``train``, the Q-network of ``stoprag``).

One set-up for both: data-parallel workers with a CPU share each, the run's checkpoints under
``storage/name``, a worker group restarted up to ``max_failures`` times (the loop resumes from its last
checkpoint), and a worker group start timeout long enough for a busy machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

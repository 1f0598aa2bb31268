"""The shape every training loop takes, free of Ray (the cross-encoders' and the Stop-RAG Q-network's).

A model's training is a :class:`Training`: it resumes from a checkpoint folder and yields an
:class:`EpochEnd` after every epoch (the metrics to report and how to write the checkpoint). It trains on a
:class:`Worker`: its rank among the data-parallel workers, their number, its device, and the two calls
that make a model and a data loader distributed. :func:`raypipe.runtime.trainer.run_training` runs a
Training on every Ray Train worker (seed, resume, rank 0's checkpoint, report); tests run one in this
process on a :class:`LocalWorker`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Worker(Protocol):
    """Where one data-parallel copy of the loop runs."""

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    @property
    def device(self) -> Any: ...  # a torch.device (or its name)

    def prepare_model(self, model: Any, *, find_unused_parameters: bool = False) -> Any:
        """The model on this worker's device, wrapped for data-parallel training when the worker has peers;
        ``find_unused_parameters``: the network has parameters its loss never uses (DDP must tolerate them)."""
        ...

    def prepare_loader(self, loader: Any) -> Any:
        """The data loader giving this worker its share of every epoch (batches stay on the CPU)."""
        ...


@dataclass(frozen=True)
class LocalWorker:
    """The only worker, in this process: no peers, nothing to wrap."""

    rank: int = 0
    world: int = 1
    device: Any = "cpu"

    def prepare_model(self, model: Any, *, find_unused_parameters: bool = False) -> Any:
        return model.to(self.device)

    def prepare_loader(self, loader: Any) -> Any:
        return loader


@dataclass(frozen=True)
class EpochEnd:
    """One finished epoch: what the workers report, and (for rank 0) how to write its checkpoint."""

    metrics: dict[str, Any]
    save: Callable[[Path], None]  # writes the checkpoint's files into an empty folder
    name: str | None = None  # the checkpoint folder's name in the training run (None: the runner picks one)


class Training(Protocol):
    """One model's (or one series of models') training, epoch by epoch."""

    def resume(self, folder: Path) -> None:
        """Continue from a checkpoint folder that an earlier :class:`EpochEnd` saved."""
        ...

    def epochs(self) -> Iterator[EpochEnd]:
        """Train, yielding after every epoch (the caller saves and reports before the next one starts)."""
        ...

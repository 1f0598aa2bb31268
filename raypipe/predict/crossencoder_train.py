"""Fine-tuning the cross-encoders, free of Ray: every task in turn, epoch by epoch, a checkpoint per epoch.

A :class:`~raypipe.core.training.Training` that :func:`raypipe.runtime.trainer.run_training` runs on every
Ray Train worker (:mod:`raypipe.stages.train`): one worker group serves all tasks, so the workers and
libraries start once, not once per model. Each epoch's optimizer steps accumulate gradients to the
effective batch (DDP syncs only on the step's last micro-batch) and record the loss, averaged over the
workers, in the task's curve. A checkpoint is the CrossEncoder folder, the curve so far and its metadata
(:data:`~raypipe.predict.crossencoder.META_FILE`); its score keeps every task's last epoch and lets the
earlier ones go once superseded. After a restart the loop starts after the last task that finished, or
again at the task that was cut short.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raypipe.core.training import EpochEnd, Worker
from raypipe.predict.crossencoder import CURVE_FILE, META_FILE, Task, new_crossencoder

FINAL_SCORE = 1_000_000  # last epochs outrank every intermediate one, so keeping tasks + 1 keeps them all


class CrossEncoderTraining:
    """The tasks of a :func:`~raypipe.predict.crossencoder.loop_config`, trained on ``worker``."""

    def __init__(self, config: dict[str, Any], worker: Worker) -> None:
        self.config, self.worker, self.first = config, worker, 0

    def resume(self, folder: Path) -> None:
        meta = json.loads((folder / META_FILE).read_text())
        self.first = meta["index"] + 1 if meta["final"] else meta["index"]

    def epochs(self) -> Iterator[EpochEnd]:
        for index, task in enumerate(self.config["tasks"]):
            if index >= self.first:
                yield from self._task_epochs(index, task)

    def _task_epochs(self, index: int, task: Task) -> Iterator[EpochEnd]:
        import torch

        config = self.config
        torch.manual_seed(config["seed"])
        started = time.monotonic()
        ce = new_crossencoder(config["base"], task.relation, config["dropout"])
        net = self.worker.prepare_model(ce.model)
        collate = partial(collate_batch, ce.tokenizer, config["max_tokens"])
        loader = torch.utils.data.DataLoader(
            list(zip(task.texts, task.labels)), batch_size=config["batch_size"], shuffle=True, collate_fn=collate
        )
        loader = self.worker.prepare_loader(loader)
        optimizer = torch.optim.AdamW(net.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
        curve: list[dict[str, Any]] = []
        for epoch in range(1, config["epochs"] + 1):
            steps = train_epoch(net, loader, optimizer, config["accum"], self.worker, epoch, len(curve))
            curve += steps
            final = epoch == config["epochs"]
            metrics = {
                "task": task.name,
                "epoch": epoch,
                "final": final,
                "train_loss": float(np.mean([s["loss"] for s in steps])),
                "seconds": time.monotonic() - started,
                "keep_score": (FINAL_SCORE if final else 0) + index,
            }
            meta = {**metrics, "index": index, "rows": len(task.texts), "relation": task.relation, "key": task.key}
            save = partial(save_checkpoint, ce, list(curve), meta)
            yield EpochEnd(metrics, save, f"{task.name}_epoch{epoch}")


def collate_batch(tokenizer, max_tokens: int, batch: list[tuple[str, float]]) -> dict:
    """(text, label) pairs as the model's inputs, with the labels under ``labels``."""
    import torch

    enc = tokenizer([t for t, _ in batch], truncation=True, max_length=max_tokens, padding=True, return_tensors="pt")
    enc["labels"] = torch.tensor([y for _, y in batch], dtype=torch.float32)
    return enc


def train_epoch(net, loader, optimizer, accum: int, worker: Worker, epoch: int, step: int) -> list[dict[str, Any]]:
    """One epoch of MSE training, an optimizer step every ``accum`` micro-batches (and at the epoch's end);
    returns a curve row per optimizer step (epoch, step counted on from ``step``, loss: mean over workers)."""
    import torch

    if worker.world > 1 and hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    net.train()
    optimizer.zero_grad()
    loss_fn, rows = torch.nn.MSELoss(), []
    pending, running = 0, 0.0
    for micro, batch in enumerate(loader, start=1):
        batch = {k: v.to(worker.device) for k, v in batch.items()}
        y = batch.pop("labels")
        sync = micro % accum == 0 or micro == len(loader)
        with net.no_sync() if (worker.world > 1 and not sync) else contextlib.nullcontext():
            loss = loss_fn(net(**batch).logits.squeeze(-1).float(), y)
            (loss / accum).backward()
        running += loss.item()
        pending += 1
        if sync:
            optimizer.step()
            optimizer.zero_grad()
            mean_loss = torch.tensor([running / pending])
            if worker.world > 1:
                torch.distributed.all_reduce(mean_loss)
                mean_loss /= worker.world
            step += 1
            rows.append({"epoch": epoch, "step": step, "loss": float(mean_loss.item())})
            pending, running = 0, 0.0
    return rows


def save_checkpoint(ce, curve: list[dict[str, Any]], meta: dict[str, Any], folder: Path) -> None:
    """The CrossEncoder folder with the task's curve so far and its metadata."""
    ce.save(str(folder))
    pd.DataFrame(curve).to_csv(folder / CURVE_FILE, index=False)
    (folder / META_FILE).write_text(json.dumps(meta))

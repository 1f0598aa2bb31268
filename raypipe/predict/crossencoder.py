"""Supervised relation regressors: a MiniLM cross-encoder (num_labels=1) fine-tuned with MSE on Ray Train.

One model per relation x target. ``train_crossencoder`` runs a TorchTrainer with
``ScalingConfig(num_workers, use_gpu)`` from the config: data-parallel workers (DDP; gloo on CPUs, NCCL
on GPUs), each reading its shard, gradients accumulated to the effective batch. Every epoch ends with a
checkpoint (the CrossEncoder folder plus the training curve so far) reported to Ray Train.
The model's output is the raw regression value (identity activation, not CrossEncoder's default sigmoid).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from raypipe.core.config import TrainConfig
from raypipe.predict.relations import SPECIAL_TOKENS

log = logging.getLogger(__name__)
CURVE_FILE = "curve.csv"
META_FILE = "meta.json"
DONE = ".complete"


@dataclass(frozen=True)
class TrainedModel:
    path: Path  # CrossEncoder folder
    curve: pd.DataFrame  # epoch, step, loss (per optimizer step; mean over workers)
    seconds: float
    effective_batch_size: int
    rows: int


def accumulation_steps(cfg: TrainConfig) -> int:
    """Micro-steps per optimizer step so that batch_size x workers x steps ~ effective_batch_size."""
    return max(1, round(cfg.effective_batch_size / (cfg.batch_size * cfg.num_workers)))


def new_crossencoder(base: str, relation: str):
    """A CrossEncoder regressor from ``base`` with the relation's marker tokens added."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(base, num_labels=1, activation_fn=torch.nn.Identity())
    added = model.tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[relation])})
    if added:
        model.model.resize_token_embeddings(len(model.tokenizer))
    return model


def load_crossencoder(path: str | Path):
    import torch
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), num_labels=1, activation_fn=torch.nn.Identity())


def predict_texts(model, texts: list[str], max_tokens: int, batch_size: int = 64) -> np.ndarray:
    """Raw regression outputs for texts (the model's logits)."""
    import torch

    net, tok = model.model, model.tokenizer
    net.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tok(
                texts[start : start + batch_size],
                truncation=True,
                max_length=max_tokens,
                padding=True,
                return_tensors="pt",
            )
            enc = {k: v.to(net.device) for k, v in enc.items()}
            out.append(net(**enc).logits.squeeze(-1).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


@dataclass(frozen=True)
class Task:
    """One model to fine-tune: a relation x target x fold, with its training texts and labels."""

    name: str
    relation: str
    texts: list[str]
    labels: list[float]
    key: str = ""  # fingerprint of data and settings (task_key), written next to the model


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker: fine-tune every task in turn (DDP, gradient accumulation), a checkpoint per epoch.

    One worker group serves all tasks, so the workers and libraries start once, not once per model.
    Checkpoint scores keep every task's last epoch and drop its earlier epochs once superseded.
    """
    import ray.train
    import ray.train.torch
    import torch
    from ray.train import Checkpoint

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if config["threads"]:
        torch.set_num_threads(config["threads"])
    device = ray.train.torch.get_device()
    first = 0
    resumed = ray.train.get_checkpoint()  # set when Ray Train restarted the worker group after a failure
    if resumed is not None:
        with resumed.as_directory() as folder:
            meta = json.loads((Path(folder) / META_FILE).read_text())
        first = meta["index"] + 1 if meta["final"] else meta["index"]
    for index, task in enumerate(config["tasks"]):
        if index < first:
            continue
        torch.manual_seed(config["seed"])
        started = time.monotonic()
        ce = new_crossencoder(config["base"], task.relation)
        tok = ce.tokenizer
        net = ray.train.torch.prepare_model(ce.model)

        def collate(batch, tok=tok):
            enc = tok(
                [t for t, _ in batch],
                truncation=True,
                max_length=config["max_tokens"],
                padding=True,
                return_tensors="pt",
            )
            enc["labels"] = torch.tensor([y for _, y in batch], dtype=torch.float32)
            return enc

        loader = torch.utils.data.DataLoader(
            list(zip(task.texts, task.labels)), batch_size=config["batch_size"], shuffle=True, collate_fn=collate
        )
        loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
        optimizer = torch.optim.AdamW(net.parameters(), lr=config["lr"])
        accum, loss_fn, curve, step = config["accum"], torch.nn.MSELoss(), [], 0
        for epoch in range(1, config["epochs"] + 1):
            if world > 1 and hasattr(loader.sampler, "set_epoch"):
                loader.sampler.set_epoch(epoch)
            net.train()
            optimizer.zero_grad()
            pending, running = 0, 0.0
            for micro, batch in enumerate(loader, start=1):
                batch = {k: v.to(device) for k, v in batch.items()}
                y = batch.pop("labels")
                sync = micro % accum == 0 or micro == len(loader)
                with net.no_sync() if (world > 1 and not sync) else contextlib.nullcontext():
                    loss = loss_fn(net(**batch).logits.squeeze(-1).float(), y)
                    (loss / accum).backward()
                running += loss.item()
                pending += 1
                if sync:
                    optimizer.step()
                    optimizer.zero_grad()
                    mean_loss = torch.tensor([running / pending])
                    if world > 1:
                        torch.distributed.all_reduce(mean_loss)
                        mean_loss /= world
                    step += 1
                    curve.append({"epoch": epoch, "step": step, "loss": float(mean_loss.item())})
                    pending, running = 0, 0.0
            final = epoch == config["epochs"]
            metrics = {
                "task": task.name,
                "epoch": epoch,
                "final": final,
                "train_loss": float(np.mean([c["loss"] for c in curve if c["epoch"] == epoch])),
                "seconds": time.monotonic() - started,
                # last epochs outrank every intermediate one, so num_to_keep = tasks + 1 keeps them all
                "keep_score": (1_000_000 if final else 0) + index,
            }
            if rank == 0:
                with tempfile.TemporaryDirectory() as tmp:
                    ce.save(tmp)
                    pd.DataFrame(curve).to_csv(Path(tmp) / CURVE_FILE, index=False)
                    meta = {
                        **metrics,
                        "index": index,
                        "rows": len(task.texts),
                        "relation": task.relation,
                        "key": task.key,
                    }
                    (Path(tmp) / META_FILE).write_text(json.dumps(meta))
                    ray.train.report(
                        metrics,
                        checkpoint=Checkpoint.from_directory(tmp),
                        checkpoint_dir_name=f"{task.name}_epoch{epoch}",
                    )
            else:
                ray.train.report(metrics)


def train_crossencoders(
    tasks: list[Task], cfg: TrainConfig, models_dir: Path, seed: int = 0, max_failures: int = 2
) -> dict[str, TrainedModel]:
    """Fine-tune every task in one TorchTrainer run; each last-epoch model lands in ``model_dir(task)``.

    A task whose model is already complete (an earlier or interrupted run) is not trained again. When a
    worker dies (e.g. killed by the node's memory monitor), Ray Train restarts the worker group up to
    ``max_failures`` times and the workers resume after the last finished task (its checkpoint).
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raypipe.core.models import resolve_sentence_model

    done, todo = {}, []
    for task in tasks:
        folder, key = model_dir(models_dir, task.name), task_key(task, cfg, seed)
        if _reuse(folder, key, models_dir / "ray_train", task.name):
            log.info("%s: already trained with the same data and settings, reusing %s", task.name, folder)
            done[task.name] = load_trained(folder, cfg)
            continue
        keep = ~np.isnan(np.asarray(task.labels, dtype=float))
        texts = [t for t, k in zip(task.texts, keep) if k]
        labels = [float(y) for y, k in zip(task.labels, keep) if k]
        if len(texts) < cfg.num_workers * 2:
            raise ValueError(f"{task.name}: {len(texts)} training rows are too few for {cfg.num_workers} workers")
        todo.append(Task(task.name, task.relation, texts, labels, key))
    if not todo:
        return done
    config = {
        "base": str(resolve_sentence_model(cfg.base_model)),
        "tasks": todo,
        "max_tokens": cfg.max_tokens,
        "batch_size": cfg.batch_size,
        "accum": accumulation_steps(cfg),
        "lr": cfg.learning_rate,
        "epochs": cfg.epochs,
        "seed": seed,
        "threads": 0 if cfg.use_gpu else max(1, int(math.floor(cfg.cpus_per_worker))),
    }
    # Ray Train gives a worker group 60 s to start; a busy 2-core machine can need several minutes
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "900")
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker={"CPU": cfg.cpus_per_worker}
        ),
        run_config=RunConfig(
            name=f"crossencoders-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=str((models_dir / "ray_train").resolve()),
            checkpoint_config=CheckpointConfig(num_to_keep=len(todo) + 1, checkpoint_score_attribute="keep_score"),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    started = time.monotonic()
    result = trainer.fit()
    log.info("Ray Train: %d models in %.0f s", len(todo), time.monotonic() - started)
    finals = {m["task"]: c for c, m in result.best_checkpoints if m.get("final")}
    missing = [t.name for t in todo if t.name not in finals]
    if missing:
        raise RuntimeError(f"Ray Train finished without final checkpoints for {missing}")
    for task in todo:
        target = model_dir(models_dir, task.name)
        if target.exists():
            shutil.rmtree(target)
        with finals[task.name].as_directory() as ckpt:
            shutil.copytree(ckpt, target)
        (target / DONE).write_text(task.key)
        done[task.name] = load_trained(target, cfg)
    return done


def task_key(task: Task, cfg: TrainConfig, seed: int) -> str:
    """Fingerprint of a task's data and training settings: a rerun reuses a model only when it matches."""
    settings = cfg.model_dump(
        include={
            "base_model",
            "max_tokens",
            "learning_rate",
            "epochs",
            "effective_batch_size",
            "batch_size",
            "num_workers",
        }
    )
    payload = json.dumps([task.relation, task.texts, [None if y != y else y for y in task.labels], settings, seed])
    return hashlib.sha256(payload.encode()).hexdigest()


def _reuse(folder: Path, key: str, ray_storage: Path, name: str) -> bool:
    """Whether ``folder`` holds this task's model, recovering it from an interrupted Ray Train run if needed."""
    if (folder / DONE).exists() and (folder / DONE).read_text() == key:
        return True
    for meta_path in sorted(ray_storage.glob(f"*/{name}_epoch*/{META_FILE}")):
        meta = json.loads(meta_path.read_text())
        if meta.get("final") and meta.get("key") == key:
            if folder.exists():
                shutil.rmtree(folder)
            shutil.copytree(meta_path.parent, folder)
            (folder / DONE).write_text(key)
            return True
    return False


def model_dir(models_dir: Path, name: str) -> Path:
    return models_dir / "crossencoders" / name


def load_trained(path: Path, cfg: TrainConfig) -> TrainedModel:
    meta = json.loads((path / META_FILE).read_text())
    return TrainedModel(
        path=path,
        curve=pd.read_csv(path / CURVE_FILE),
        seconds=float(meta["seconds"]),
        effective_batch_size=cfg.batch_size * cfg.num_workers * accumulation_steps(cfg),
        rows=int(meta["rows"]),
    )

"""Supervised relation regressors: a MiniLM cross-encoder (num_labels=1) fine-tuned with MSE on Ray Train.

One model per relation x target. ``train_crossencoder`` runs a TorchTrainer with
``ScalingConfig(num_workers, use_gpu)`` from the config: data-parallel workers (DDP; gloo on CPUs, NCCL
on GPUs), each reading its shard, gradients accumulated to the effective batch. Every epoch ends with a
checkpoint (the CrossEncoder folder plus the training curve so far) reported to Ray Train.
The model's output is the raw regression value (identity activation, not CrossEncoder's default sigmoid).
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from raypipe.config import TrainConfig
from raypipe.predict.relations import SPECIAL_TOKENS

log = logging.getLogger(__name__)
CURVE_FILE = "curve.csv"


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
            enc = tok(texts[start : start + batch_size], truncation=True, max_length=max_tokens, padding=True, return_tensors="pt")
            enc = {k: v.to(net.device) for k, v in enc.items()}
            out.append(net(**enc).logits.squeeze(-1).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker: DDP fine-tuning with gradient accumulation, a checkpoint per epoch."""
    import ray.train
    import ray.train.torch
    import torch
    from ray.train import Checkpoint

    torch.manual_seed(config["seed"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if config["threads"]:
        torch.set_num_threads(config["threads"])
    ce = new_crossencoder(config["base"], config["relation"])
    tok = ce.tokenizer
    net = ray.train.torch.prepare_model(ce.model)
    device = ray.train.torch.get_device()
    texts, labels = config["texts"], config["labels"]

    def collate(batch):
        enc = tok([t for t, _ in batch], truncation=True, max_length=config["max_tokens"], padding=True, return_tensors="pt")
        enc["labels"] = torch.tensor([y for _, y in batch], dtype=torch.float32)
        return enc

    loader = torch.utils.data.DataLoader(
        list(zip(texts, labels)), batch_size=config["batch_size"], shuffle=True, collate_fn=collate
    )
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    optimizer = torch.optim.AdamW(net.parameters(), lr=config["lr"])
    accum, loss_fn, curve, step = config["accum"], torch.nn.MSELoss(), [], 0
    for epoch in range(config["epochs"]):
        if world > 1 and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        net.train()
        optimizer.zero_grad()
        pending, running = 0, 0.0
        for micro, batch in enumerate(loader, start=1):
            batch = {k: v.to(device) for k, v in batch.items()}
            y = batch.pop("labels")
            last = micro == len(loader)
            sync = micro % accum == 0 or last
            ctx_mgr = net.no_sync() if (world > 1 and not sync) else contextlib.nullcontext()
            with ctx_mgr:
                loss = loss_fn(net(**batch).logits.squeeze(-1), y)
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
                curve.append({"epoch": epoch + 1, "step": step, "loss": float(mean_loss.item())})
                pending, running = 0, 0.0
        epoch_loss = float(np.mean([c["loss"] for c in curve if c["epoch"] == epoch + 1]))
        metrics = {"epoch": epoch + 1, "train_loss": epoch_loss, "steps": step}
        if rank == 0:
            with tempfile.TemporaryDirectory() as tmp:
                ce.save(tmp)
                pd.DataFrame(curve).to_csv(Path(tmp) / CURVE_FILE, index=False)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))
        else:
            ray.train.report(metrics)


def train_crossencoder(
    texts: list[str],
    labels: np.ndarray,
    relation: str,
    cfg: TrainConfig,
    out_dir: Path,
    storage: Path,
    name: str,
    seed: int = 0,
) -> TrainedModel:
    """Fine-tune one regressor on Ray Train; the last epoch's model is copied to ``out_dir``."""
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raypipe.models import resolve_sentence_model

    labels = np.asarray(labels, dtype=float)
    keep = ~np.isnan(labels)
    texts = [t for t, k in zip(texts, keep) if k]
    labels = labels[keep]
    if len(texts) < cfg.num_workers * 2:
        raise ValueError(f"{name}: {len(texts)} training rows are too few for {cfg.num_workers} workers")
    accum = accumulation_steps(cfg)
    config = {
        "base": str(resolve_sentence_model(cfg.base_model)),
        "relation": relation,
        "texts": texts,
        "labels": labels.tolist(),
        "max_tokens": cfg.max_tokens,
        "batch_size": cfg.batch_size,
        "accum": accum,
        "lr": cfg.learning_rate,
        "epochs": cfg.epochs,
        "seed": seed,
        "threads": max(1, int(math.floor(cfg.cpus_per_worker))) if not cfg.use_gpu else 0,
    }
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker={"CPU": cfg.cpus_per_worker}
        ),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage.resolve()),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    )
    start = time.monotonic()
    result = trainer.fit()
    seconds = time.monotonic() - start
    if result.checkpoint is None:
        raise RuntimeError(f"{name}: Ray Train finished without a checkpoint")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    with result.checkpoint.as_directory() as ckpt:
        shutil.copytree(ckpt, out_dir)
    curve = pd.read_csv(out_dir / CURVE_FILE)
    log.info("%s: %d rows, %d steps, final loss %.4f, %.1f s", name, len(texts), len(curve), curve["loss"].iloc[-1], seconds)
    return TrainedModel(
        path=out_dir,
        curve=curve,
        seconds=seconds,
        effective_batch_size=cfg.batch_size * cfg.num_workers * accum,
        rows=len(texts),
    )

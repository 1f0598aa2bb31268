"""Supervised relation regressors: a MiniLM cross-encoder (num_labels=1) fine-tuned with MSE.

One model per relation x target x fold. This module is the Ray-free part: the model, its predictions,
the training tasks, which models a rerun reuses (keyed by data and settings) and the files a trained
model leaves (the CrossEncoder folder, its training curve and metadata). The fine-tuning steps are
:mod:`raypipe.predict.crossencoder_train` (gradients accumulated to the effective batch, a checkpoint of this
layout every epoch); Ray Train runs them on data-parallel workers (DDP) in :mod:`raypipe.stages.train`.
The model's output is the raw regression value (identity activation, not CrossEncoder's default sigmoid).
As the seed trains them (DanielTian97/agentic_rag_predictions ``predictions/supervised/train.py``:
``weight_decay=0.0``, ``dropout_rate=0.0`` passed by ``relations.py`` ``build_regression_model`` as
``hidden_dropout_prob`` and ``attention_probs_dropout_prob``): AdamW without weight decay
(``train.weight_decay``) and no dropout (``train.dropout``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from raypipe.core.config import TrainConfig
from raypipe.core.models import resolve_sentence_model
from raypipe.predict.relations import SPECIAL_TOKENS

log = logging.getLogger(__name__)
CURVE_FILE = "curve.csv"
META_FILE = "meta.json"
DONE = ".complete"
TRAIN_STORAGE = "ray_train"  # Ray Train's run folders (per-epoch checkpoints), under the models folder


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


def new_crossencoder(base: str, relation: str, dropout: float | None = None):
    """A CrossEncoder regressor from ``base`` with the relation's marker tokens added.

    ``dropout`` (None: the base model's own) sets the hidden and attention dropout in the model's
    config, as the seed does, and every dropout module of the loaded network, so that architectures
    with other config names (and BERT's classifier, which follows hidden_dropout_prob) get it too.
    """
    import torch
    from sentence_transformers import CrossEncoder

    config = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    model = CrossEncoder(base, num_labels=1, activation_fn=torch.nn.Identity(), config_kwargs=config)
    if dropout is not None:
        for module in model.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = dropout
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


def plan_training(
    tasks: list[Task], cfg: TrainConfig, models_dir: Path, seed: int, ray_storage: Path | None
) -> tuple[dict[str, TrainedModel], list[Task]]:
    """Split ``tasks`` into the models already trained with the same data and settings (an earlier run, or an
    interrupted one whose final checkpoints are in the folder ``ray_storage``: reused) and those to train
    (their unlabelled rows dropped, their ``key`` set). ``ray_storage`` None: no interrupted run is looked for
    (Ray Train's storage is a URI)."""
    done, todo = {}, []
    for task in tasks:
        folder, key = model_dir(models_dir, task.name), task_key(task, cfg, seed)
        if _reuse(folder, key, ray_storage, task.name):
            log.info("%s: already trained with the same data and settings, reusing %s", task.name, folder)
            done[task.name] = load_trained(folder, cfg)
            continue
        keep = ~np.isnan(np.asarray(task.labels, dtype=float))
        texts = [t for t, k in zip(task.texts, keep) if k]
        labels = [float(y) for y, k in zip(task.labels, keep) if k]
        if len(texts) < cfg.num_workers * 2:
            raise ValueError(f"{task.name}: {len(texts)} training rows are too few for {cfg.num_workers} workers")
        todo.append(Task(task.name, task.relation, texts, labels, key))
    return done, todo


def loop_config(todo: list[Task], cfg: TrainConfig, seed: int) -> dict:
    """What every training worker needs: the tasks and the settings of the fine-tuning loop."""
    return {
        "base": str(resolve_sentence_model(cfg.base_model)),
        "tasks": todo,
        "max_tokens": cfg.max_tokens,
        "batch_size": cfg.batch_size,
        "accum": accumulation_steps(cfg),
        "lr": cfg.learning_rate,
        "weight_decay": cfg.weight_decay,
        "dropout": cfg.dropout,
        "epochs": cfg.epochs,
        "seed": seed,
        "threads": 0 if cfg.use_gpu else max(1, int(math.floor(cfg.cpus_per_worker))),
    }


def install_model(task: Task, checkpoint: Path, models_dir: Path, cfg: TrainConfig) -> TrainedModel:
    """Copy a task's final checkpoint folder to ``model_dir`` and mark it complete with the task's key."""
    target = model_dir(models_dir, task.name)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(checkpoint, target)
    (target / DONE).write_text(task.key)
    return load_trained(target, cfg)


def task_key(task: Task, cfg: TrainConfig, seed: int) -> str:
    """Fingerprint of a task's data and training settings: a rerun reuses a model only when it matches."""
    settings = cfg.model_dump(
        include={
            "base_model",
            "max_tokens",
            "learning_rate",
            "weight_decay",
            "dropout",
            "epochs",
            "effective_batch_size",
            "batch_size",
            "num_workers",
        }
    )
    payload = json.dumps([task.relation, task.texts, [None if y != y else y for y in task.labels], settings, seed])
    return hashlib.sha256(payload.encode()).hexdigest()


def _reuse(folder: Path, key: str, ray_storage: Path | None, name: str) -> bool:
    """Whether ``folder`` holds this task's model, recovering it from an interrupted Ray Train run if needed."""
    if (folder / DONE).exists() and (folder / DONE).read_text() == key:
        return True
    if ray_storage is None:
        return False
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

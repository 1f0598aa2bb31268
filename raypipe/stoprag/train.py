"""The Stop-RAG Q-network's training, free of Ray: each worker's share of an epoch, the CONT targets, the
loss, and :class:`QNetTraining`, the epochs with their checkpoints that
:func:`raypipe.runtime.trainer.run_training` runs on every Ray Train worker
(:func:`raypipe.stages.stoprag.train_loop`).

Each step follows the public trainer (``MultiheadTrainer``): the STOP head regresses r_t; the CONT head
regresses the target of :func:`raypipe.stoprag.targets.cont_target`, whose bootstrap values
max(Q_stop, Q_cont) of the future states come from the current network without gradients (here in eval
mode, so dropout does not add noise to targets); lambda follows the cosine schedule over optimizer steps.
Loss = MSE(Q_stop, r_t) + MSE(Q_cont, target); for the ``binary`` ablation the CONT term is a BCE of
the margin Q_stop - Q_cont against the label r_t >= MC. AdamW with warmup and a cosine learning rate.
A checkpoint is the network (``qnet/``), the optimizer and scheduler state and the per-epoch metrics; a
restarted run resumes after its last epoch with the same shuffles and state as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

from raypipe.core.config import StopRagConfig
from raypipe.core.training import EpochEnd, Worker
from raypipe.stoprag.qnet import QNetwork, encode_states, load_tokenizer, score
from raypipe.stoprag.targets import Sample, cont_target, cosine_lambda, needs_bootstrap

log = logging.getLogger(__name__)
NETWORK_DIR = "qnet"  # the network's folder in a checkpoint
TRAINER_STATE = "trainer_state.pt"
HISTORY = "history.json"  # per-epoch metrics, in every checkpoint
LOG_EVERY = 10  # optimizer steps between progress lines


def loop_config(
    texts: list[str], samples: Sequence[Sample], cfg: StopRagConfig, encoder_path: str | Path, seed: int, meta: dict
) -> dict[str, Any]:
    """What every training worker needs (``cfg.max_length`` resolved): the states, the samples, the settings,
    and ``meta`` for the saved network's metadata (with the input length)."""
    return {
        "stoprag": cfg.model_dump(mode="json"),
        "texts": texts,
        "samples": [asdict(s) for s in samples],
        "encoder_path": str(encoder_path),
        "seed": seed,
        "threads": max(1, int(cfg.cpus_per_worker)),
        "meta": {"max_length": cfg.max_length, **meta},
    }


class QNetTraining:
    """The Q-network of a :func:`loop_config`, trained on ``worker``: every worker takes the same number of
    steps per epoch (:func:`worker_share`), the gradient clipped, lambda annealed over the steps."""

    def __init__(self, config: dict[str, Any], worker: Worker) -> None:
        from transformers import get_cosine_schedule_with_warmup

        cfg = self.cfg = StopRagConfig.model_validate(config["stoprag"])
        self.texts: list[str] = config["texts"]
        self.samples = [Sample(**s) for s in config["samples"]]
        self.seed, self.meta, self.worker = config["seed"], config["meta"], worker
        self.tokenizer = load_tokenizer(config["encoder_path"])
        self.net = QNetwork(config["encoder_path"], pooling=cfg.pooling, dropout=cfg.dropout)
        # some encoders carry parameters the heads never use (BERT's pooler): let DDP tolerate them
        self.model = worker.prepare_model(self.net, find_unused_parameters=True)
        self.steps_per_epoch = max(1, math.ceil(len(self.samples) / (worker.world * cfg.batch_size)))
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.scheduler = get_cosine_schedule_with_warmup(
            self.optimizer, int(cfg.warmup_ratio * self.total_steps), self.total_steps
        )
        self.start_epoch, self.step, self.history = 0, 0, []

    def resume(self, folder: Path) -> None:
        state = torch.load(folder / TRAINER_STATE, map_location="cpu", weights_only=False)
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.start_epoch, self.step, self.history = state["epoch"] + 1, state["step"], state["history"]
        log.info("resuming from epoch %d (step %d)", self.start_epoch, self.step)

    def epochs(self) -> Iterator[EpochEnd]:
        cfg = self.cfg
        started, first_step = time.perf_counter(), self.step
        for epoch in range(self.start_epoch, cfg.epochs):
            loss = self._train_epoch(epoch, started, first_step)
            lam = cosine_lambda(self.step, self.total_steps, cfg.lambda_start, cfg.lambda_end)
            metrics = {"epoch": epoch, "step": self.step, "loss": loss, "lambda": lam}
            self.history.append(metrics)
            yield EpochEnd(metrics, partial(self._save, epoch))

    def _train_epoch(self, epoch: int, started: float, first_step: int) -> float:
        """One epoch of this worker's share; returns its mean loss."""
        cfg, worker, size = self.cfg, self.worker, self.steps_per_epoch * self.cfg.batch_size
        mine = worker_share(len(self.samples), self.seed, epoch, worker.rank, worker.world, size)
        total_loss = 0.0
        for b in range(self.steps_per_epoch):
            batch = [self.samples[i] for i in mine[b * cfg.batch_size : (b + 1) * cfg.batch_size]]
            lam = cosine_lambda(self.step, self.total_steps, cfg.lambda_start, cfg.lambda_end)
            targets = cont_targets(self.net, self.tokenizer, self.texts, batch, cfg, lam)
            loss = batch_loss(self.model, self.tokenizer, self.texts, batch, targets, cfg, worker.device)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            total_loss += loss.item()
            if worker.rank == 0 and (self.step % LOG_EVERY == 0 or self.step == self.total_steps):
                rate = (self.step - first_step) / (time.perf_counter() - started)
                log.info(
                    "step %d/%d  loss %.4f  lambda %.3f  %.2f steps/s",
                    self.step,
                    self.total_steps,
                    loss.item(),
                    lam,
                    rate,
                )
        return total_loss / self.steps_per_epoch

    def _save(self, epoch: int, folder: Path) -> None:
        """The network (with ``meta``), the trainer's state to resume from, and the metrics so far."""
        self.net.save(folder / NETWORK_DIR, self.tokenizer, extra=self.meta)
        state = {
            "model": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": epoch,
            "step": self.step,
            "history": self.history,
        }
        torch.save(state, folder / TRAINER_STATE)
        (folder / HISTORY).write_text(json.dumps(self.history))


def worker_share(n_samples: int, seed: int, epoch: int, rank: int, world: int, size: int) -> list[int]:
    """The sample indices worker ``rank`` trains on in ``epoch``: one permutation (the same on every
    worker) dealt round-robin, repeated to ``size`` so that every worker takes the same number of steps."""
    order = list(range(n_samples))
    random.Random(seed + epoch).shuffle(order)
    mine = order[rank::world] or order
    return (mine * (size // len(mine) + 1))[:size]


def cont_targets(
    net: QNetwork, tokenizer, texts: list[str], batch: list[Sample], cfg: StopRagConfig, lam: float
) -> list[float]:
    """CONT targets for a batch, bootstrapping the future states' values where the target needs them."""
    if not needs_bootstrap(cfg.target):
        return [cont_target(cfg.target, s, (), lam) for s in batch]
    future = sorted({i for s in batch for i in s.future_states})
    values: dict[int, float] = {}
    if future:
        was_training = net.training
        net.eval()
        q_stop, q_cont = score(
            net, tokenizer, [texts[i] for i in future], _max_length(cfg), cfg.batch_size, cfg.state_truncation
        )
        net.train(was_training)
        values = {i: max(s, c) for i, s, c in zip(future, q_stop, q_cont)}
    return [cont_target(cfg.target, s, [values[i] for i in s.future_states], lam) for s in batch]


def batch_loss(
    model: torch.nn.Module,
    tokenizer,
    texts: list[str],
    batch: list[Sample],
    targets: list[float],
    cfg: StopRagConfig,
    device: torch.device,
) -> torch.Tensor:
    """MSE(Q_stop, r_t) plus the CONT term (MSE to the targets; BCE of the margin for ``binary``)."""
    enc = encode_states(tokenizer, [texts[s.state] for s in batch], _max_length(cfg), cfg.state_truncation)
    q_stop, q_cont = model(enc["input_ids"].to(device), enc["attention_mask"].to(device))
    rewards = torch.tensor([s.reward for s in batch], dtype=q_stop.dtype, device=device)
    target = torch.tensor(targets, dtype=q_stop.dtype, device=device)
    if cfg.target == "binary":
        second = functional.binary_cross_entropy_with_logits(q_stop - q_cont, target)
    else:
        second = functional.mse_loss(q_cont, target)
    return functional.mse_loss(q_stop, rewards) + second


def _max_length(cfg: StopRagConfig) -> int:
    if cfg.max_length is None:
        raise ValueError(
            "stoprag.max_length must be resolved to the encoder's limit before training (train_qnetwork does)"
        )
    return cfg.max_length

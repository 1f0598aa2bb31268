"""Training the Stop-RAG Q-network with Ray Train (TorchTrainer; CPU workers here, GPUs on clusters).

Each step follows the public trainer (``MultiheadTrainer``): the STOP head regresses r_t; the CONT head
regresses the target of :func:`raypipe.stoprag.targets.cont_target`, whose bootstrap values
max(Q_stop, Q_cont) of the future states come from the current network without gradients (here in eval
mode, so dropout does not add noise to targets); lambda follows the cosine schedule over optimizer steps.
Loss = MSE(Q_stop, r_t) + MSE(Q_cont, target); for the ``binary`` ablation the CONT term is a BCE of
the margin Q_stop - Q_cont against the label r_t >= MC. AdamW with warmup and a cosine learning rate.

Every epoch rank 0 reports a checkpoint (network + optimizer state); after a worker failure Ray Train
restarts the workers (up to ``MAX_FAILURES`` times) and the loop resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from raypipe.core.config import StopRagConfig
from raypipe.stoprag.targets import Sample, cont_target, cosine_lambda, needs_bootstrap

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.pt"
HISTORY = "history.json"  # per-epoch metrics, in every checkpoint
MAX_FAILURES = 2
LOG_EVERY = 10  # optimizer steps between progress lines


def train_loop(config: dict[str, Any]) -> None:
    """The per-worker loop (runs inside a Ray Train worker)."""
    import ray.train
    import ray.train.torch
    import torch
    from transformers import get_cosine_schedule_with_warmup

    from raypipe.stoprag.qnet import QNetwork, load_tokenizer, score

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    cfg = StopRagConfig.model_validate(config["stoprag"])
    texts: list[str] = config["texts"]
    samples = [Sample(**s) for s in config["samples"]]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(cfg.worker_num_cpus)))
    torch.manual_seed(config["seed"])

    tokenizer = load_tokenizer(config["encoder_path"])
    net = QNetwork(config["encoder_path"], pooling=cfg.pooling, dropout=cfg.dropout)
    # some encoders carry parameters the heads never use (BERT's pooler): let DDP tolerate them
    model = ray.train.torch.prepare_model(net, parallel_strategy_kwargs={"find_unused_parameters": True})
    device = ray.train.torch.get_device()
    steps_per_epoch = max(1, math.ceil(len(samples) / (world * cfg.batch_size)))
    total_steps = steps_per_epoch * cfg.epochs
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    start_epoch, step, history = 0, 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / TRAINER_STATE, map_location="cpu", weights_only=False)
            net.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            start_epoch, step, history = state["epoch"] + 1, state["step"], state["history"]
        log.info("resuming from epoch %d (step %d)", start_epoch, step)

    mse, bce = torch.nn.MSELoss(), torch.nn.BCEWithLogitsLoss()
    started, first_step = time.perf_counter(), step
    for epoch in range(start_epoch, cfg.epochs):
        order = list(range(len(samples)))
        random.Random(config["seed"] + epoch).shuffle(order)  # the same permutation on every worker
        mine = order[rank::world] or order
        mine = (mine * (steps_per_epoch * cfg.batch_size // len(mine) + 1))[: steps_per_epoch * cfg.batch_size]
        total_loss = 0.0
        for b in range(steps_per_epoch):
            batch = [samples[i] for i in mine[b * cfg.batch_size : (b + 1) * cfg.batch_size]]
            lam = cosine_lambda(step, total_steps, cfg.lambda_start, cfg.lambda_end)
            targets = _targets(net, tokenizer, texts, batch, cfg, lam, score)
            enc = tokenizer([texts[s.state] for s in batch], truncation=True, max_length=cfg.max_length, padding=True, return_tensors="pt").to(device)
            q_stop, q_cont = model(enc["input_ids"], enc["attention_mask"])
            rewards = torch.tensor([s.reward for s in batch], dtype=q_stop.dtype, device=device)
            target = torch.tensor(targets, dtype=q_stop.dtype, device=device)
            second = bce(q_stop - q_cont, target) if cfg.target == "binary" else mse(q_cont, target)
            loss = mse(q_stop, rewards) + second
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            total_loss += loss.item()
            if rank == 0 and (step % LOG_EVERY == 0 or step == total_steps):
                rate = (step - first_step) / (time.perf_counter() - started)
                log.info("step %d/%d  loss %.4f  lambda %.3f  %.2f steps/s", step, total_steps, loss.item(), lam, rate)
        metrics = {"epoch": epoch, "step": step, "loss": total_loss / steps_per_epoch,
                   "lambda": cosine_lambda(step, total_steps, cfg.lambda_start, cfg.lambda_end)}
        history.append(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                net.save(Path(tmp) / "qnet", tokenizer, extra=config["meta"])
                state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "history": history}
                torch.save(state, Path(tmp) / TRAINER_STATE)
                (Path(tmp) / HISTORY).write_text(json.dumps(history))
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt)


def _targets(net, tokenizer, texts, batch: list[Sample], cfg: StopRagConfig, lam: float, score) -> list[float]:
    """CONT targets for a batch, bootstrapping the future states' values where the target needs them."""
    if not needs_bootstrap(cfg.target):
        return [cont_target(cfg.target, s, (), lam) for s in batch]
    future = sorted({i for s in batch for i in s.future_states})
    values: dict[int, float] = {}
    if future:
        was_training = net.training
        net.eval()
        q_stop, q_cont = score(net, tokenizer, [texts[i] for i in future], cfg.max_length, cfg.batch_size)
        net.train(was_training)
        values = {i: max(s, c) for i, s, c in zip(future, q_stop, q_cont)}
    return [cont_target(cfg.target, s, [values[i] for i in s.future_states], lam) for s in batch]


def train_qnetwork(
    texts: list[str],
    samples: list[Sample],
    cfg: StopRagConfig,
    encoder_path: str | Path,
    dest: str | Path,
    *,
    seed: int = 0,
    meta: dict | None = None,
    name: str = "stoprag",
) -> tuple[Path, list[dict]]:
    """Train on Ray (``ray.init`` already done) and copy the final network to the folder ``dest``.

    Returns ``dest`` and the per-epoch metrics. Ray Train's own run folder (checkpoints) is
    ``ray_train/<name>`` beside ``dest`` while training; it is removed once the network is copied out.
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not samples:
        raise ValueError("no training states: every training trajectory has a single state or no reward signal")
    target = Path(dest).resolve()
    storage = target.parent / "ray_train"
    shutil.rmtree(storage / name, ignore_errors=True)  # a rerun trains afresh, never on an old run's state
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "stoprag": cfg.model_dump(mode="json"),
            "texts": texts,
            "samples": [asdict(s) for s in samples],
            "encoder_path": str(encoder_path),
            "seed": seed,
            "meta": {"max_length": cfg.max_length, **(meta or {})},
        },
        scaling_config=ScalingConfig(
            num_workers=cfg.workers, use_gpu=cfg.use_gpu, resources_per_worker={"CPU": cfg.worker_num_cpus}
        ),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            failure_config=FailureConfig(max_failures=MAX_FAILURES),
        ),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"Ray Train finished without a checkpoint: {result.error}")
    with result.checkpoint.as_directory() as folder:
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(Path(folder) / "qnet", target)
        history = json.loads((Path(folder) / HISTORY).read_text())
    shutil.rmtree(storage / name, ignore_errors=True)  # checkpoints (network + optimizer state) served their purpose
    return target, history

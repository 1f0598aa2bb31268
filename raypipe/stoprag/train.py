"""The Stop-RAG Q-network's training step, free of Ray: each worker's share of an epoch, the CONT targets,
the loss. The Ray Train worker loop that runs them is :func:`raypipe.stages.stoprag.train_loop`.

Each step follows the public trainer (``MultiheadTrainer``): the STOP head regresses r_t; the CONT head
regresses the target of :func:`raypipe.stoprag.targets.cont_target`, whose bootstrap values
max(Q_stop, Q_cont) of the future states come from the current network without gradients (here in eval
mode, so dropout does not add noise to targets); lambda follows the cosine schedule over optimizer steps.
Loss = MSE(Q_stop, r_t) + MSE(Q_cont, target); for the ``binary`` ablation the CONT term is a BCE of
the margin Q_stop - Q_cont against the label r_t >= MC. AdamW with warmup and a cosine learning rate.
"""

from __future__ import annotations

import random

import torch
from torch.nn import functional

from raypipe.core.config import StopRagConfig
from raypipe.stoprag.qnet import QNetwork, encode_states, score
from raypipe.stoprag.targets import Sample, cont_target, needs_bootstrap


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
        q_stop, q_cont = score(net, tokenizer, [texts[i] for i in future], _max_length(cfg), cfg.batch_size, cfg.state_truncation)
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
        raise ValueError("stoprag.max_length must be resolved to the encoder's limit before training (train_qnetwork does)")
    return cfg.max_length

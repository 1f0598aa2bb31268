"""Fine-tuning of the agent on its supervised trajectories, as a Ray-free :class:`~raypipe.core.training.Training`.

Each trajectory's segments (:mod:`raypipe.agenttrain.trajectories`) are tokenized one by one and joined, so
the labels are exactly the tokens of the agent's own turns; the prompt and the observation blocks are
context (label -100). The base model is frozen but for the trained part of the adapted linear layers
(``method``): LoRA factors (:class:`LoRAPart`) or the weights themselves (:class:`FullPart`, saved as deltas),
trained with AdamW, one trajectory per forward pass, ``grad_accum`` per optimizer step. The epoch's order is a
permutation seeded by ``seed + epoch``, so a run resumed from a checkpoint (trained tensors, optimizer, step)
goes on with the same batches. A progress line (loss, tokens/s, ETA) is logged every step
by rank 0, and a checkpoint ends every ``checkpoint_steps`` steps (an :class:`~raypipe.core.training.EpochEnd`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from raypipe.agenttrain.trajectories import AGENT
from raypipe.core.adapter import (
    ADAPTER_FILE,
    DELTA,
    LORA_A,
    LORA_B,
    MANIFEST_FILE,
    artifact_method,
    check_method,
    merge_adapter,
    read_manifest,
    sha256_of,
)
from raypipe.core.models import locate_adapter
from raypipe.core.training import EpochEnd, Worker

log = logging.getLogger(__name__)
IGNORE = -100
STATE_FILE = "state.pt"
PROGRESS_FILE = "progress.json"


def encode(segments: Sequence[dict[str, str]], tokenizer) -> tuple[list[int], list[int]]:
    """(input ids, labels): every segment tokenized on its own, the labels the agent segments' ids, else -100."""
    ids: list[int] = []
    labels: list[int] = []
    for segment in segments:
        part = tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
        ids += part
        labels += part if segment["kind"] == AGENT else [IGNORE] * len(part)
    return ids, labels


def lora_modules():
    import torch
    from torch import nn

    class LoRALinear(nn.Module):
        """A frozen linear layer plus ``scale * B @ A`` (A: rank x in, small random; B: out x rank, zeros)."""

        def __init__(self, base: nn.Linear, rank: int, scale: float):
            super().__init__()
            self.base, self.scale = base, scale
            self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

        def forward(self, x):
            return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scale

    return LoRALinear


def target_linears(model, targets: Sequence[str], layers: int | None = None) -> dict[str, Any]:
    """The linear layers named ``...<target>`` in the top ``layers`` decoder layers (or all), by module name."""
    from torch import nn

    n_layers = model.config.num_hidden_layers
    first = 0 if layers is None else max(0, n_layers - layers)
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or not any(name.endswith(t) for t in targets):
            continue
        index = next((int(p) for p in name.split(".") if p.isdigit()), None)
        if index is not None and index >= first:
            found[name] = module
    if not found:
        raise ValueError(f"no linear layer matches the targets {list(targets)}")
    return found


def freeze(model) -> None:
    for p in model.parameters():
        p.requires_grad_(False)


def add_lora(model, rank: int, alpha: float, targets: Sequence[str], layers: int | None = None) -> list[str]:
    """Freeze ``model`` and wrap its :func:`target_linears` with LoRA; returns the adapted weights' names (as in
    the model's state dict)."""
    LoRALinear = lora_modules()
    freeze(model)
    adapted = []
    for name, module in target_linears(model, targets, layers).items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(module, rank, alpha / rank))
        adapted.append(f"{name}.weight")
    return adapted


def adapter_factors(model) -> dict[str, Any]:
    """The LoRA factors keyed as the artifact stores them (``<base weight name>.lora_A`` / ``.lora_B``)."""
    factors = {}
    for name, tensor in model.state_dict().items():
        for suffix in (LORA_A, LORA_B):
            if name.endswith(suffix):
                factors[name[: -len(suffix)] + ".weight" + suffix] = tensor.detach().float().contiguous().clone()
    return factors


def load_factors(model, factors: dict[str, Any]) -> None:
    check_method(factors, "lora", "LoRA factors")
    state = {}
    for key, tensor in factors.items():
        for suffix in (LORA_A, LORA_B):
            if key.endswith(".weight" + suffix):
                state[key[: -len(".weight" + suffix)] + suffix] = tensor
    missing = model.load_state_dict(state, strict=False)
    if missing.unexpected_keys:
        raise ValueError(f"checkpoint factors the model does not have: {missing.unexpected_keys[:3]}")


class LoRAPart:
    """``method: lora``: LoRA factors on the target layers, saved as ``<weight name>.lora_A`` / ``.lora_B``."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def prepare(self, model) -> list[Any]:
        c = self.config
        add_lora(model, c["lora_rank"], c["lora_alpha"], c["lora_targets"], c["lora_layers"])
        return [p for p in model.parameters() if p.requires_grad]

    def state(self, model) -> dict[str, Any]:
        return adapter_factors(model)

    def load(self, model, tensors: dict[str, Any]) -> None:
        load_factors(model, tensors)


class FullPart:
    """``method: full``: the target layers' weights themselves, saved as ``<weight name>.delta`` (the trained
    weight minus the base weight, float32), which conversion adds to the base as it adds LoRA's ``B @ A``."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.base: dict[str, Any] = {}

    def prepare(self, model) -> list[Any]:
        freeze(model)
        linears = target_linears(model, self.config["lora_targets"], self.config["lora_layers"])
        self.base = {f"{name}.weight": m.weight.detach().float().clone() for name, m in linears.items()}
        for m in linears.values():
            m.weight.requires_grad_(True)
        return [m.weight for m in linears.values()]

    def state(self, model) -> dict[str, Any]:
        weights = model.state_dict()
        return {
            name + DELTA: (weights[name].detach().float().cpu() - base).contiguous() for name, base in self.base.items()
        }

    def load(self, model, tensors: dict[str, Any]) -> None:
        check_method(tensors, "full", "weight deltas")
        unknown = [key for key in tensors if key[: -len(DELTA)] not in self.base]
        if unknown:
            raise ValueError(f"deltas of weights this run does not train: {unknown[:3]}")
        model.load_state_dict(merge_adapter(self.base, tensors), strict=False)


PARTS = {"lora": LoRAPart, "full": FullPart}


def unwrap(model):
    return getattr(model, "module", model)


def causal_loss(model, ids, labels):
    """Mean cross-entropy of the labelled tokens (each predicted from the tokens before it), and their count."""
    import torch.nn.functional as F

    logits = model(input_ids=ids).logits[:, :-1]
    target = labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE)
    return loss, int((target != IGNORE).sum())


class AgentTuning:
    """The fine-tuning run of ``config`` (:func:`loop_config`) on one worker."""

    def __init__(self, config: dict[str, Any], worker: Worker):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config, self.worker = config, worker
        tokenizer = AutoTokenizer.from_pretrained(config["model_path"])
        rows = [json.loads(line) for line in Path(config["data"]).read_text().splitlines() if line.strip()]
        self.examples = [encode(r["segments"], tokenizer) for r in rows]
        self.examples = [e for e in self.examples if len(e[0]) <= config["max_tokens"]]
        if not self.examples:
            raise ValueError(f"no trajectory of {config['data']} fits {config['max_tokens']} tokens")
        model = AutoModelForCausalLM.from_pretrained(config["model_path"], dtype=torch.float32)
        self.part = PARTS[config["method"]](config)
        self.params = self.part.prepare(model)
        if config.get("init_adapter"):  # a second round: the first round's tensors, a new optimizer
            from safetensors.torch import load_file

            self.part.load(model, load_file(str(Path(config["init_adapter"]) / ADAPTER_FILE)))
        self.model = worker.prepare_model(model)
        self.optimizer = torch.optim.AdamW(self.params, lr=config["learning_rate"], weight_decay=0.0)
        share = math.ceil(len(self.examples) / worker.world)
        self.steps_per_epoch = max(1, math.ceil(share / config["grad_accum"]))
        self.total_steps = self.steps_per_epoch * config["epochs"]
        if config.get("max_steps"):
            self.total_steps = min(self.total_steps, config["max_steps"])
        self.step = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.tokens = 0
        if config.get("resume_from"):  # an interrupted run's last checkpoint (a rerun of the command)
            self.resume(Path(config["resume_from"]))

    def resume(self, folder: Path) -> None:
        import torch
        from safetensors.torch import load_file

        self.part.load(unwrap(self.model), load_file(str(folder / ADAPTER_FILE)))
        state = torch.load(folder / STATE_FILE, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.tokens = state["step"], state["tokens"]
        self.cpu_s, self.wall_s = state["cpu_s"], state["wall_s"]
        log.info("resumed at step %d of %d", self.step, self.total_steps)

    def batches(self, epoch: int) -> list[list[int]]:
        """This worker's optimizer steps of ``epoch``: lists of example indices (a seeded permutation)."""
        import torch

        order = torch.randperm(len(self.examples), generator=torch.Generator().manual_seed(self.config["seed"] + epoch))
        order = order.tolist()
        mine = order[self.worker.rank :: self.worker.world]
        share = math.ceil(len(order) / self.worker.world)
        mine += order[: share - len(mine)]  # every worker makes the same number of steps (DDP's collectives)
        accum = self.config["grad_accum"]
        return [mine[i : i + accum] for i in range(0, len(mine), accum)]

    def train_step(self, indices: list[int]) -> tuple[float, int]:
        import torch

        self.model.train()
        self.optimizer.zero_grad()
        total, tokens = 0.0, 0
        for i in indices:
            ids, labels = self.examples[i]
            device = self.worker.device
            loss, _ = causal_loss(self.model, torch.tensor([ids], device=device), torch.tensor([labels], device=device))
            (loss / len(indices)).backward()
            total += float(loss.detach()) / len(indices)
            tokens += len(ids)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        return total, tokens

    def epochs(self) -> Iterator[EpochEnd]:
        """Train to ``total_steps``, a checkpoint every ``checkpoint_steps``; resumed at the end (a finished run
        rerun), the one checkpoint of where it stands."""
        losses: list[float] = []
        if self.step >= self.total_steps:
            yield self.checkpoint(losses)
        while self.step < self.total_steps:
            epoch, offset = divmod(self.step, self.steps_per_epoch)
            indices = self.batches(epoch)[offset]
            wall, cpu = time.monotonic(), time.process_time()
            loss, tokens = self.train_step(indices)
            self.wall_s += time.monotonic() - wall
            self.cpu_s += time.process_time() - cpu
            self.tokens += tokens
            self.step += 1
            losses.append(loss)
            if self.worker.rank == 0:
                rate = self.tokens / max(self.wall_s, 1e-9)
                eta = self.wall_s / self.step * (self.total_steps - self.step)
                log.info(
                    "step %d/%d  loss %.4f  %.0f tokens/s  ETA %s",
                    self.step,
                    self.total_steps,
                    loss,
                    rate,
                    time.strftime("%H:%M:%S", time.gmtime(eta)),
                )
            if self.step % self.config["checkpoint_steps"] == 0 or self.step == self.total_steps:
                yield self.checkpoint(losses)
                losses = []

    def checkpoint(self, losses: list[float]) -> EpochEnd:
        mean = sum(losses) / len(losses) if losses else None
        metrics = {
            "step": self.step,
            "total_steps": self.total_steps,
            "loss": mean,
            "losses": list(losses),
            "tokens": self.tokens,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "final": self.step >= self.total_steps,
        }
        return EpochEnd(metrics, self.save_to(metrics), name=f"step_{self.step:06d}")

    def save_to(self, metrics: dict[str, Any]):
        import torch
        from safetensors.torch import save_file

        tensors = self.part.state(unwrap(self.model))
        state = {
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "tokens": self.tokens,
        }

        def save(folder: Path) -> None:
            save_file(tensors, str(folder / ADAPTER_FILE))
            torch.save(state, folder / STATE_FILE)
            (folder / PROGRESS_FILE).write_text(json.dumps(metrics))

        return save


def check_init(agent_train, manifest: dict[str, Any]) -> None:
    """Refuse an ``init_adapter`` this run cannot start from: another method's, or other targets (or rank)."""
    made, method = manifest["hyperparameters"], artifact_method(manifest)
    if method != agent_train.method:
        raise ValueError(
            f"agent_train.init_adapter={agent_train.init_adapter} is a {method} artifact; this run's "
            f"agent_train.method is {agent_train.method}"
        )
    shape = ("lora_targets", "lora_layers") + (("lora_rank",) if method == "lora" else ())
    differ = [k for k in shape if made.get(k) != getattr(agent_train, k)]
    if differ:
        raise ValueError(f"agent_train.init_adapter={agent_train.init_adapter}: its {', '.join(differ)} differ")


def loop_config(
    agent_train, model_path: Path, data: Path, seed: int, resume_from: Path | None = None
) -> dict[str, Any]:
    """What every worker needs (plain values, sent to Ray Train's workers); ``resume_from``: a checkpoint folder
    to start from (Ray Train restarts after a failure resume from their own run's last checkpoint instead)."""
    keys = (
        "method",
        "lora_rank",
        "lora_alpha",
        "lora_targets",
        "lora_layers",
        "epochs",
        "max_steps",
        "learning_rate",
        "grad_accum",
        "checkpoint_steps",
        "max_tokens",
    )
    init = None if agent_train.init_adapter is None else locate_adapter(agent_train.init_adapter)
    if init is not None:
        check_init(agent_train, read_manifest(init))
    return {
        **{k: getattr(agent_train, k) for k in keys},
        "init_adapter": None if init is None else str(init),
        "model_path": str(model_path),
        "data": str(data),
        "seed": seed,
        "threads": agent_train.threads,
        "resume_from": None if resume_from is None else str(resume_from),
    }


def write_artifact(
    out: Path, checkpoint: Path, config: dict[str, Any], base_source: Path, extra: dict[str, Any]
) -> dict[str, Any]:
    """The artifact folder ``out``: the final checkpoint's tensors and a manifest (base model and data digests,
    question ids, hyperparameters, seed, time and CPU taken, dev-split figures: empty until evaluated)."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(checkpoint / ADAPTER_FILE, out / ADAPTER_FILE)
    progress = json.loads((checkpoint / PROGRESS_FILE).read_text())
    rows = [json.loads(line) for line in Path(config["data"]).read_text().splitlines() if line.strip()]
    lora = config["method"] == "lora"
    manifest = {
        "kind": f"{'LoRA factors' if lora else 'weight deltas'} of the agent, merged into the base model at "
        "conversion (engine.adapter)",
        "note": "made by raypipe tune-agent from the bundled training questions; not a published checkpoint",
        "method": config["method"],
        "adapter_sha256": sha256_of(out / ADAPTER_FILE),
        "adapter_bytes": (out / ADAPTER_FILE).stat().st_size,
        **({"scale": config["lora_alpha"] / config["lora_rank"]} if lora else {}),
        "base_model": str(base_source),
        "base_model_sha256": sha256_of(base_source),
        "data_sha256": sha256_of(Path(config["data"])),
        "question_ids": [r["qid"] for r in rows],
        "hyperparameters": {
            k: v for k, v in config.items() if k not in ("model_path", "data", "seed", "resume_from", "init_adapter")
        },
        "init_adapter": None
        if config["init_adapter"] is None
        else {
            "path": config["init_adapter"],
            "adapter_sha256": sha256_of(Path(config["init_adapter"]) / ADAPTER_FILE),
        },
        "seed": config["seed"],
        "steps": progress["step"],
        "tokens": progress["tokens"],
        "train_wall_s": progress["wall_s"],
        "train_cpu_s": progress["cpu_s"],
        "dev": {},
        **extra,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    return manifest


def latest_checkpoint(storage: Path) -> Path | None:
    """The checkpoint with the most steps under a local Ray Train storage folder (an interrupted run's), if any."""
    found = [(json.loads(p.read_text())["step"], p.parent) for p in Path(storage).glob(f"**/step_*/{PROGRESS_FILE}")]
    return max(found)[1] if found else None

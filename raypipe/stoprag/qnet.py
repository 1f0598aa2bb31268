"""The Stop-RAG Q-network: a transformer encoder with two heads, Q(s, STOP) and Q(s, CONT).

As the public model (chosolbee/MHQA-SetVerify ``MultiheadModel``): the encoder's pooled output (first
token for encoder-only models; ``mean`` pooling as an option) feeds two heads, each
Dropout -> Linear(h, h) -> SiLU -> Linear(h, 1). The encoder is any Hugging Face checkpoint
(the embedded default is MiniLM). A saved network is a folder: the encoder and tokenizer
(``save_pretrained``), ``heads.pt`` and ``qnet.json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.stoprag.targets import rounds_from_history, state_text

log = logging.getLogger(__name__)

META = "qnet.json"
HEADS = "heads.pt"


def _head(hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))


class QNetwork(nn.Module):
    def __init__(self, encoder_path: str | Path, pooling: Literal["cls", "mean"] = "cls", dropout: float = 0.1):
        super().__init__()
        from transformers import AutoModel

        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be cls or mean, got {pooling!r}")
        self.encoder = AutoModel.from_pretrained(str(encoder_path))
        self.pooling = pooling
        self.dropout = dropout
        hidden = self.encoder.config.hidden_size
        self.stop_head = _head(hidden, dropout)
        self.cont_head = _head(hidden, dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q_stop, Q_cont), each of shape (batch,)."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return self.stop_head(pooled).squeeze(-1), self.cont_head(pooled).squeeze(-1)

    def save(self, folder: str | Path, tokenizer, extra: dict | None = None) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        torch.save({"stop_head": self.stop_head.state_dict(), "cont_head": self.cont_head.state_dict()}, folder / HEADS)
        meta = {"pooling": self.pooling, "dropout": self.dropout, **(extra or {})}
        (folder / META).write_text(json.dumps(meta, indent=2))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> tuple["QNetwork", dict]:
        """A saved network (eval mode) and its metadata (threshold, max_length, state settings ...)."""
        folder = Path(folder)
        if not (folder / META).exists():
            raise FileNotFoundError(f"{folder}: not a saved Stop-RAG Q-network (no {META}); run jobs/stoprag.py first")
        meta = json.loads((folder / META).read_text())
        net = cls(folder, pooling=meta["pooling"], dropout=meta["dropout"])
        heads = torch.load(folder / HEADS, map_location="cpu")
        net.stop_head.load_state_dict(heads["stop_head"])
        net.cont_head.load_state_dict(heads["cont_head"])
        return net.eval(), meta


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@torch.no_grad()
def score(net: QNetwork, tokenizer, texts: Sequence[str], max_length: int, batch_size: int = 32) -> tuple[list[float], list[float]]:
    """Q_stop and Q_cont for every text (no gradients; the caller chooses train or eval mode)."""
    q_stop: list[float] = []
    q_cont: list[float] = []
    device = next(net.parameters()).device
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            list(texts[start : start + batch_size]), truncation=True, max_length=max_length, padding=True, return_tensors="pt"
        ).to(device)
        s, c = net(enc["input_ids"], enc["attention_mask"])
        q_stop.extend(s.float().tolist())
        q_cont.extend(c.float().tolist())
    return q_stop, q_cont


class StopRagController:
    """Stop-RAG online (:class:`raypipe.agents.hooks.StopController`): after each iteration from
    ``first_decision`` on, score the state and stop when Q_stop - Q_cont > threshold.

    Built from a saved network folder, whose metadata holds the tuned threshold and the state settings.
    The network loads on first use, so the controller pickles light (it travels to generation actors);
    scoring runs in a worker thread so the actor's event loop keeps serving other trajectories.
    """

    def __init__(self, folder: str | Path, threshold: float | None = None):
        self.folder = Path(folder)
        if not (self.folder / META).exists():
            raise FileNotFoundError(f"{self.folder}: not a saved Stop-RAG Q-network (no {META}); run jobs/stoprag.py first")
        self.meta = json.loads((self.folder / META).read_text())
        if threshold is None and "threshold" not in self.meta:
            raise ValueError(f"{self.folder}: no tuned threshold in {META}; pass one")
        self.threshold = float(self.meta["threshold"] if threshold is None else threshold)
        self._net: tuple[QNetwork, Any] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_net", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _net=None, _lock=threading.Lock())

    def margin(self, question: str, history: list[dict]) -> float:
        with self._lock:  # one forward pass at a time; the first call loads the network
            if self._net is None:
                self._net = (QNetwork.load(self.folder)[0], load_tokenizer(self.folder))
            net, tokenizer = self._net
            text = state_text(question, rounds_from_history(history), self.meta["state_input"], self.meta["doc_chars"])
            q_stop, q_cont = score(net, tokenizer, [text], self.meta["max_length"])
        return q_stop[0] - q_cont[0]

    async def decide(self, question: str, history: list[dict]) -> StopDecision:
        current = max(row["iteration"] for row in history)
        if current < self.meta["first_decision"]:
            return CONTINUE
        margin = await asyncio.to_thread(self.margin, question, history)
        if margin > self.threshold:
            return StopDecision(stop=True, reason=f"stoprag:{margin:.3f}")
        return CONTINUE


def controller_from_path(path: str | Path, threshold: float | None = None) -> StopRagController:
    """The Stop-RAG controller for a network folder or a run directory holding one at ``stoprag/qnet``."""
    folder = Path(path)
    if not (folder / META).exists() and (folder / "stoprag" / "qnet" / META).exists():
        folder = folder / "stoprag" / "qnet"
    return StopRagController(folder, threshold)

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.rows import OnlineRow
from raypipe.stoprag.targets import SEP, rounds_from_history, state_text

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
    def load(cls, folder: str | Path) -> tuple[QNetwork, dict]:
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


REFERENCE_MAX_LENGTH = 2048  # ``--max-length`` of Training/multihead_stop_decider_train.py l.541 (DeBERTa-v3)
_UNBOUNDED = 1_000_000  # tokenizers without a limit report a huge model_max_length


def encoder_max_length(folder: str | Path) -> int:
    """The longest input the encoder accepts: its tokenizer's limit and, for encoders with absolute
    position embeddings, their count; an encoder bounded by neither (DeBERTa-v3's relative positions)
    gets the reference's 2048 tokens."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    limits = [load_tokenizer(folder).model_max_length]
    positions = getattr(config, "max_position_embeddings", None)
    if positions and getattr(config, "position_biased_input", True):
        limits.append(positions)
    bounded = [int(n) for n in limits if n and n < _UNBOUNDED]
    return min(bounded) if bounded else REFERENCE_MAX_LENGTH


def truncate_ids(
    ids: list[int], max_length: int, sep_id: int | None, keep: Literal["newest", "start"] = "newest"
) -> list[int]:
    """One encoded state cut to ``max_length`` tokens.

    ``newest`` (default): the first token, the question and its separator stay (the question cut to half
    the budget at most); then the newest tokens, so the newest document, which tells s_t from s_(t-1),
    is in the input; of the older tokens only the separators stay, one per dropped document, so that
    the input still counts the state's iterations and no two states of a trajectory encode alike.
    ``start``: the tokenizer's own cut at the end, as the reference calls it
    (``multihead_stop_decider_train.py`` l.73-79); with its 2048 tokens and one document per iteration it
    seldom cuts, but a shorter encoder then loses the newest documents and successive states become
    the same input.
    """
    if len(ids) <= max_length:
        return ids
    if keep == "start":
        return ids[: max_length - 1] + ids[-1:]
    q_end = ids.index(sep_id, 1) if sep_id is not None and sep_id in ids[1:-1] else 0
    head = ids[: min(q_end + 1, max_length // 2)]
    head[-1] = ids[q_end]  # a question cut short still ends in its separator
    body, budget = ids[len(head) :], max_length - len(head)
    seps_before = [0]  # seps_before[i]: separators among body[:i]
    for token in body:
        seps_before.append(seps_before[-1] + (token == sep_id))
    tail = next(n for n in range(budget, -1, -1) if seps_before[len(body) - n] + n <= budget or n == 0)
    dropped_seps = [sep_id] * min(seps_before[len(body) - tail], budget - tail)
    return head + dropped_seps + body[len(body) - tail :]


def encode_states(
    tokenizer, texts: Sequence[str], max_length: int, keep: Literal["newest", "start"] = "newest"
) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` (padded) for state texts, each cut by :func:`truncate_ids`."""
    encoded = tokenizer(list(texts), add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    rows = [truncate_ids(ids, max_length, tokenizer.sep_token_id, keep) for ids in encoded]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def score(
    net: QNetwork,
    tokenizer,
    texts: Sequence[str],
    max_length: int,
    batch_size: int = 32,
    keep: Literal["newest", "start"] = "newest",
) -> tuple[list[float], list[float]]:
    """Q_stop and Q_cont for every text (no gradients; the caller chooses train or eval mode)."""
    q_stop: list[float] = []
    q_cont: list[float] = []
    device = next(net.parameters()).device
    for start in range(0, len(texts), batch_size):
        enc = encode_states(tokenizer, texts[start : start + batch_size], max_length, keep)
        s, c = net(enc["input_ids"].to(device), enc["attention_mask"].to(device))
        q_stop.extend(s.float().tolist())
        q_cont.extend(c.float().tolist())
    return q_stop, q_cont


# How a state is built and cut: a saved network's metadata must hold them (jobs/stoprag.py writes them).
STATE_KEYS = {"max_length", "state_input", "doc_chars", "docs_per_iteration", "state_truncation", "first_decision"}


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
            raise FileNotFoundError(
                f"{self.folder}: not a saved Stop-RAG Q-network (no {META}); run jobs/stoprag.py first"
            )
        self.meta = json.loads((self.folder / META).read_text())
        missing = sorted(STATE_KEYS - set(self.meta))
        if missing:
            raise ValueError(f"{self.folder}: {META} lacks the state settings {missing} (an older network); retrain it")
        if threshold is None and "threshold" not in self.meta:
            raise ValueError(f"{self.folder}: no tuned threshold in {META}; pass one")
        self.threshold = float(self.meta["threshold"] if threshold is None else threshold)
        self._net: tuple[QNetwork, Any] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_net", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _net=None, _lock=threading.Lock())

    def margin(self, question: str, history: Sequence[Mapping[str, Any]]) -> float:
        with self._lock:  # one forward pass at a time; the first call loads the network
            if self._net is None:
                self._net = (QNetwork.load(self.folder)[0], load_tokenizer(self.folder))
            net, tokenizer = self._net
            meta = self.meta
            text = state_text(
                question,
                rounds_from_history(history),
                meta["state_input"],
                meta["doc_chars"],
                meta["docs_per_iteration"],
                tokenizer.sep_token or SEP,
            )
            q_stop, q_cont = score(net, tokenizer, [text], meta["max_length"], keep=meta["state_truncation"])
        return q_stop[0] - q_cont[0]

    async def decide(self, question: str, history: list[OnlineRow]) -> StopDecision:
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

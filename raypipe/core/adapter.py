"""A tuned-agent artifact (``raypipe tune-agent``) and how it is applied to its base model.

An artifact is a folder: ``adapter.safetensors`` holds LoRA factors ``<weight name>.lora_A`` (rank x in) and
``<weight name>.lora_B`` (out x rank) for the adapted linear weights of the base model, in float32;
``manifest.json`` holds their scale (alpha / rank), the adapter file's sha256, the base model's sha256 and how
the artifact was made. Applying it adds ``scale * B @ A`` to each weight: the merged model computes what the
base model with the adapter computes, with no adapter code at inference (vLLM loads a plain folder).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

ADAPTER_FILE = "adapter.safetensors"
MANIFEST_FILE = "manifest.json"
LORA_A, LORA_B = ".lora_A", ".lora_B"


class ArtifactError(ValueError):
    """An artifact that is incomplete, altered, or made for another base model."""


def sha256_of(path: Path) -> str:
    """sha256 of a file, or of a folder's ``*.safetensors`` files (their names and digests, sorted)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ArtifactError(f"{path}: no .safetensors files to hash")
        return hashlib.sha256("".join(f"{f.name}:{sha256_of(f)}\n" for f in files).encode()).hexdigest()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(artifact: Path) -> dict[str, Any]:
    """The artifact's manifest, its adapter file checked against the sha256 it records."""
    artifact = Path(artifact)
    manifest_path, adapter = artifact / MANIFEST_FILE, artifact / ADAPTER_FILE
    if not manifest_path.exists() or not adapter.exists():
        raise ArtifactError(f"{artifact}: not a tuned-agent artifact (needs {MANIFEST_FILE} and {ADAPTER_FILE})")
    manifest = json.loads(manifest_path.read_text())
    actual = sha256_of(adapter)
    if manifest.get("adapter_sha256") != actual:
        raise ArtifactError(f"{adapter}: sha256 {actual} differs from the manifest's {manifest.get('adapter_sha256')}")
    return manifest


def merge_adapter(state: dict[str, Any], factors: dict[str, Any], scale: float) -> dict[str, Any]:
    """``state`` (a model's state dict) with ``scale * B @ A`` added to every weight ``factors`` adapts."""
    merged = dict(state)
    names = {key[: -len(LORA_A)] for key in factors if key.endswith(LORA_A)}
    for name in sorted(names):
        if name not in state:
            raise ArtifactError(f"the adapter adapts {name}, which the base model does not have")
        a, b = factors[name + LORA_A], factors[name + LORA_B]
        weight = state[name]
        merged[name] = (weight.float() + scale * (b.float() @ a.float())).to(weight.dtype)
    return merged


def apply_artifact(base_folder: Path, base_sha256: str, artifact: Path, target: Path) -> None:
    """Write ``base_folder``'s model with the artifact merged into ``target`` (a Hugging Face folder);
    ``base_sha256`` is the base model's digest (:func:`sha256_of` of the file or folder it came from), which must
    be the one the artifact was trained on."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = read_manifest(artifact)
    if manifest.get("base_model_sha256") != base_sha256:
        made_for = manifest.get("base_model_sha256")
        raise ArtifactError(f"{artifact} was made for base model {made_for}, not {base_sha256}")
    model = AutoModelForCausalLM.from_pretrained(str(base_folder), dtype=torch.float32)
    factors = load_file(str(Path(artifact) / ADAPTER_FILE))
    model.load_state_dict(merge_adapter(model.state_dict(), factors, float(manifest["scale"])))
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    shutil.copyfile(Path(base_folder) / "config.json", target / "config.json")  # unchanged (and its extra keys kept)
    AutoTokenizer.from_pretrained(str(base_folder)).save_pretrained(target)
    (target / "tuned_agent.json").write_text(json.dumps(manifest, indent=1))

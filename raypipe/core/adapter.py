"""A tuned-agent artifact (``raypipe tune-agent``) and how it is applied to its base model.

An artifact is a folder: ``adapter.safetensors`` holds, for the adapted linear weights of the base model, in
float32, either LoRA factors ``<weight name>.lora_A`` (rank x in) and ``<weight name>.lora_B`` (out x rank)
(``method: lora``) or weight deltas ``<weight name>.delta`` (the trained weight minus the base weight, ``method:
full``); ``manifest.json`` holds the method, LoRA's scale (alpha / rank), the adapter file's sha256, the base
model's sha256 and how the artifact was made. Applying it adds ``scale * B @ A`` (or the delta) to each weight:
the merged model computes what the trained model computes, with no adapter code at inference (vLLM loads a
plain folder).
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
DELTA = ".delta"
SUFFIXES = {"lora": (LORA_A, LORA_B), "full": (DELTA,)}


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


def artifact_method(manifest: dict[str, Any]) -> str:
    """The manifest's method; artifacts made before full fine-tuning existed record none and are LoRA's."""
    return manifest.get("method", "lora")


def check_method(tensors: dict[str, Any], method: str, source: object) -> None:
    """Refuse ``tensors`` (from ``source``) that are not ``method``'s: LoRA factors where deltas are expected, or
    the reverse."""
    suffixes = SUFFIXES[method]
    foreign = sorted(key for key in tensors if not key.endswith(suffixes))
    if foreign:
        raise ArtifactError(f"{source}: {foreign[0]} is not a {method} tensor (<weight name>{'|'.join(suffixes)})")


def merge_adapter(state: dict[str, Any], tensors: dict[str, Any], scale: float = 1.0) -> dict[str, Any]:
    """``state`` (a model's state dict) with ``scale * B @ A`` (LoRA factors) or the delta added to every weight
    ``tensors`` adapts."""
    merged = dict(state)
    for key in sorted(tensors):
        if key.endswith(DELTA):
            name, update = key[: -len(DELTA)], tensors[key].float()
        elif key.endswith(LORA_A):
            name = key[: -len(LORA_A)]
            update = scale * (tensors[name + LORA_B].float() @ tensors[key].float())
        else:  # a LoRA B factor, merged with its A
            continue
        if name not in state:
            raise ArtifactError(f"the adapter adapts {name}, which the base model does not have")
        weight = state[name]
        merged[name] = (weight.float() + update).to(weight.dtype)
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
    tensors = load_file(str(Path(artifact) / ADAPTER_FILE))
    check_method(tensors, artifact_method(manifest), artifact)
    scale = float(manifest.get("scale", 1.0))  # LoRA's; a full artifact's deltas are added as they are
    model.load_state_dict(merge_adapter(model.state_dict(), tensors, scale))
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    shutil.copyfile(Path(base_folder) / "config.json", target / "config.json")  # unchanged (and its extra keys kept)
    AutoTokenizer.from_pretrained(str(base_folder)).save_pretrained(target)
    (target / "tuned_agent.json").write_text(json.dumps(manifest, indent=1))

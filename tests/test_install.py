"""A plain (non-editable) install stands on its own: the wheel carries the presets, the bundled data and the
commands, and works from a directory that is not the checkout (issue 17)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """raypipe built as a wheel and installed (without dependencies) into a folder of its own."""
    work = tmp_path_factory.mktemp("install")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(work / "wheel"),
            str(ROOT),
        ],
        check=True,
    )
    wheel = next((work / "wheel").glob("raypipe-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(work / "site"), str(wheel)],
        check=True,
    )
    return work


def run_installed(installed: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m raypipe ARGS`` with the installed copy first on the path, run outside the checkout."""
    env = {**os.environ, "PYTHONPATH": str(installed / "site")}
    return subprocess.run(
        [sys.executable, "-m", "raypipe", *args], cwd=installed, env=env, capture_output=True, text=True, timeout=300
    )


def test_wheel_carries_presets_and_bundled_data(installed):
    names = zipfile.ZipFile(next((installed / "wheel").glob("raypipe-*.whl"))).namelist()
    presets = {Path(n).stem for n in names if n.startswith("raypipe/presets/") and n.endswith(".yaml")}
    assert {"embedded", "r1searcher", "searchr1-7b-gpu", "r1searcher-7b-gpu"} <= presets
    assert "raypipe/data/mhqa/corpus.jsonl" in names
    assert {f"raypipe/data/agent/smollm2-searchr1/{f}" for f in ("adapter.safetensors", "manifest.json")} <= set(names)
    assert not any(n.startswith(("tests/", "jobs/", "configs/")) for n in names)


def test_installed_commands_find_their_presets(installed):
    where = subprocess.run(
        [sys.executable, "-c", "import raypipe; print(raypipe.__file__)"],
        cwd=installed,
        env={**os.environ, "PYTHONPATH": str(installed / "site")},
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip().startswith(str(installed / "site")), where.stdout + where.stderr

    listing = run_installed(installed, "--help")
    assert listing.returncode == 0, listing.stderr
    for job in ("index", "probe", "features", "train", "sweep", "stoprag", "report"):
        assert f"\n  {job} " in listing.stdout

    probe = run_installed(installed, "probe", "--help")
    assert probe.returncode == 0, probe.stderr
    assert "searchr1-7b-gpu" in probe.stdout  # the presets are listed from the installed package

    unknown = run_installed(installed, "probe", "--config", "no-such-preset")
    assert unknown.returncode != 0
    assert "known presets: embedded, embedded-untuned, r1searcher, r1searcher-7b-gpu, searchr1-7b-gpu" in unknown.stderr

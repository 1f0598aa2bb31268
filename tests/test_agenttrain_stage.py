"""`raypipe tune-agent` on Ray Train (issue 43): CPU workers, the artifact, a rerun resumed from the last checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiny_models import tiny_llama
from tests.test_agenttrain_tune import data_file

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_tune_agent_on_ray_train_writes_the_artifact_and_a_rerun_resumes(tmp_path):
    model = tiny_llama(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    data_file(data)
    out = tmp_path / "out"

    def tune(steps: int) -> subprocess.CompletedProcess:
        cmd = [
            sys.executable,
            str(ROOT / "jobs" / "tune_agent.py"),
            str(data),
            str(out),
            "--set",
            f"engine.model={model}",
            "--set",
            f"agent_train.max_steps={steps}",
            "--set",
            "agent_train.grad_accum=1",
            "--set",
            "agent_train.checkpoint_steps=1",
            "--set",
            "agent_train.cpus_per_worker=1",
            "--set",
            "ray.num_cpus=2",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)

    first = tune(2)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "step 2/2  loss" in first.stdout + first.stderr and "artifact" in first.stdout
    assert "engine.adapter (smollm2-searchr1) is not applied" in first.stderr  # the default's, remade from the base
    manifest = json.loads((out / "artifact" / "manifest.json").read_text())
    assert manifest["steps"] == 2 and manifest["question_ids"] == ["q0", "q1", "q2", "q3"]
    again = tune(3)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed at step 2 of 3" in again.stdout + again.stderr
    assert json.loads((out / "artifact" / "manifest.json").read_text())["steps"] == 3

"""Which agent ran (issue 43): a tuned-agent artifact is named in probe_info.yaml, the figures' note and the
report's Setup panel; an unknown artifact name fails with one line."""

from __future__ import annotations

import json

import pytest
import yaml

from raypipe.agents.probe_run import agent_info
from raypipe.analysis.setup_section import agent_line
from raypipe.core.adapter import ADAPTER_FILE, MANIFEST_FILE, sha256_of
from raypipe.core.models import ModelNotFoundError, embedded_llm_note, locate_adapter


def artifact(tmp_path, dev=None):
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / ADAPTER_FILE).write_bytes(b"factors")
    manifest = {
        "adapter_sha256": sha256_of(folder / ADAPTER_FILE),
        "note": "made by raypipe tune-agent",
        "question_ids": ["a", "b", "c"],
        "steps": 7,
        "seed": 0,
        "dev": dev or {},
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    return folder


def test_an_untuned_run_says_so(tmp_path):
    assert agent_info(None) == {"tuned": False}
    (tmp_path / "probe_info.yaml").write_text(
        yaml.safe_dump({"engine": {"model": "smollm2"}, "agent": agent_info(None)})
    )
    assert agent_line(tmp_path) == "Agent: smollm2 as published (no tuned-agent artifact)."
    assert "check raypipe's machinery" in embedded_llm_note("smollm2")


def test_a_tuned_run_names_its_artifact_and_how_it_was_made(tmp_path):
    folder = artifact(tmp_path, dev={"final_f1": 0.2, "retrieval_gain": 0.06, "utility": {"mean": 0.01}})
    info = agent_info(str(folder))
    assert info["tuned"] and info["trajectories"] == 3 and info["steps"] == 7
    assert info["dev"] == {"final_f1": 0.2, "retrieval_gain": 0.06}  # the headline figures, not the nested ones
    (tmp_path / "probe_info.yaml").write_text(yaml.safe_dump({"engine": {"model": "smollm2"}, "agent": info}))
    line = agent_line(tmp_path)
    assert str(folder) in line and "3 trajectories, 7 steps" in line and "final F1 0.200" in line
    note = embedded_llm_note("smollm2", str(folder))
    assert "not a published checkpoint" in note and str(folder) in note


def test_an_unknown_artifact_fails_with_one_line(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such artifact folder"):
        locate_adapter(str(tmp_path / "nowhere"))

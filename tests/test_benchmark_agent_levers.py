"""benchmarks/agent_levers.py: every variant is a valid raypipe setting, and the variants of one table train on
the same trajectories (a seeded subset; a variety variant samples as many from the rows it allows)."""

from __future__ import annotations

import json

import pytest

from raypipe.core.config import load_config
from tests.helpers.benchmarks import imported_benchmark


@pytest.fixture(scope="module")
def levers():
    with imported_benchmark("agent_levers") as module:
        yield module


def test_every_variant_is_a_valid_setting_that_changes_the_config(levers):
    base = load_config("embedded")
    for name, settings in levers.VARIANTS.items():
        config = load_config("embedded", [f"{k}={v}" for k, v in settings.items()])
        assert (config == base) == (name == "base" or name in levers.VARIETY), name
    assert levers.run_sets("r1-searcher") == ["agent.protocol=r1_searcher"] and levers.run_sets("lr-4e-4") == []


def test_the_subset_is_seeded_and_a_variety_variant_samples_as_many_of_its_rows(levers, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"qid": f"q{i}", "searches": 1 + i % 3} for i in range(30)]
    (data / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    subset = levers.subset_data(data, tmp_path / "a", 10, seed=0)
    again = levers.subset_data(data, tmp_path / "b", 10, seed=0)
    assert levers.read_lines(subset) == levers.read_lines(again) and len(levers.read_lines(subset)) == 10
    assert levers.subset_data(data, tmp_path / "c", None, seed=0) == data
    varied = levers.variant_data("multi-search", subset, tmp_path / "a", data, seed=0)
    chosen = [json.loads(line) for line in levers.read_lines(varied)]
    assert len(chosen) == 10 and all(r["searches"] >= 2 for r in chosen)
    with pytest.raises(SystemExit, match="more than the 30"):
        levers.subset_data(data, tmp_path / "d", 31, seed=0)

"""The report's Setup panel: every setting that differs from the seed paper's setup, from the run's config."""

import pandas as pd

from raypipe.analysis.setup_section import setup_rows
from raypipe.core.config import load_config
from raypipe.core.seed_setup import SEED_SETUP
from raypipe.stages.report import build_report


def _write(run, preset, overrides=(), stage_files=()):
    config = load_config(preset, list(overrides))
    (run / "config.yaml").write_text(__import__("yaml").safe_dump(config.model_dump(mode="json")))
    for name, more in stage_files:
        staged = load_config(preset, [*overrides, *more])
        (run / name).write_text(__import__("yaml").safe_dump(staged.model_dump(mode="json")))


def test_the_seed_setup_table_describes_every_entry():
    """raypipe/core/seed_setup.py: one described value per setting (DanielTian97/agentic_rag_predictions
    probing/run_probing.py top_k=3, prediction_head/mlp.py, supervised/train.py; pyterrier-rag's turn limit)."""
    keys = [s.key for s in SEED_SETUP]
    assert len(keys) == len(set(keys)) and all(s.source for s in SEED_SETUP)
    by_key = {s.key: s for s in SEED_SETUP}
    assert by_key["effective.top_k"].seed_value("r1_searcher") == 3
    assert by_key["train.weight_decay"].seed_value("search_r1") == 0.0
    assert by_key["agent.temperature"].seed_value("search_r1") == 0.7
    config = load_config("embedded").model_dump(mode="json")
    for setting in SEED_SETUP:  # every key names a real config field (or a resolved value)
        if setting.key.startswith("effective.") or setting.key == "train_run":
            continue
        node = config
        for part in setting.key.split("."):
            assert part in node, setting.key
            node = node[part]


def test_the_embedded_run_lists_its_deviations(tmp_path):
    _write(tmp_path, "embedded")
    frame, used = setup_rows(tmp_path)
    assert used == ["config.yaml"]
    differs = frame[~frame["matches"]].set_index("setting")
    assert differs.loc["engine.model", "this run"] == "smollm2"
    assert differs.loc["train_run", "this run"] == "none"  # cross-fitting, not the paper's train/dev
    assert differs.loc["agent.enforcement", "this run"] == "first_search"
    same = frame[frame["matches"]].set_index("setting")
    assert {
        "train.head",
        "train.head_input",
        "train.include_type",
        "train.weight_decay",
        "train.dropout",
        "stopping.theta_p",
        "top_k",
    } <= set(same.index)


def test_stage_configs_override_and_the_page_shows_the_panel(tmp_path):
    _write(
        tmp_path,
        "embedded",
        stage_files=[
            ("train.yaml", ["train.head=sklearn", "train_run=/runs/train"]),
            ("sweep.yaml", ["stopping.theta_u=0.3"]),
        ],
    )
    frame, used = setup_rows(tmp_path)
    assert used == ["config.yaml", "train.yaml", "sweep.yaml"]
    rows = frame.set_index("setting")
    assert rows.loc["train.head", "this run"] == "sklearn" and not rows.loc["train.head", "matches"]
    assert rows.loc["train_run", "matches"] and not rows.loc["stopping.theta_u", "matches"]
    result = build_report(tmp_path)
    (section,) = [s for s in result.sections if s.key == "setup"]
    assert section.status == "ok"
    table = pd.read_csv(tmp_path / "report" / "tables" / "setup.csv")
    assert len(table) == len(SEED_SETUP)
    html = result.html.read_text()
    assert "differ from the seed paper" in html and "sklearn" in html

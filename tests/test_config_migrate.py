"""Old key names: a run written before retrieval's sub-sections loads with the same values, resumes under the same
settings, and its report finds the settings it ran with; ``--set`` and presets read old names as new ones."""

import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from raypipe.agents.probe_run import check_resumable
from raypipe.analysis.setup_section import lookup, run_tree
from raypipe.core.config import ConfigError, load_config, migrate_tree
from raypipe.core.jobargs import job_parser, run_config_from_args
from raypipe.core.rundir import RunDir

OLD_CONFIG = Path(__file__).parent / "fixtures" / "config_flat_retrieval.yaml"
# The fixture's settings under today's names (written out here, not derived from the migration table).
SAME_SETTINGS = [
    "retrieval.http.retries=5",
    "retrieval.serve.max_topk=50",
    "retrieval.http.url=http://10.0.0.5:8000",
    "retrieval.encode.block_rows=5000",
    "retrieval.index.mmap=false",
    "stoprag.num_workers=3",
]


def old_run(tmp_path: Path) -> RunDir:
    """A run directory holding the old config.yaml and a trajectories table."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    shutil.copy(OLD_CONFIG, run.path / "config.yaml")
    run.write_part("trajectories", pa.table({"qid": ["q1"]}), "part-0")
    return run


def test_a_config_written_before_the_sub_sections_loads_with_the_same_values(tmp_path):
    run = old_run(tmp_path)
    loaded = run_config_from_args(job_parser("test").parse_args([]), run.path)
    assert loaded == load_config("searchr1-7b-gpu", SAME_SETTINGS)
    r = loaded.retrieval
    assert (r.index.type, r.index.dir, r.index.faiss_gpu, r.index.mmap) == (
        "flat",
        "/mnt/raypipe/index/wiki18-e5-base-v2-flat",
        "shard",
        False,
    )
    assert (r.actors.replicas, r.actors.num_gpus, r.actors.resources, r.actors.max_batch_size) == (
        2,
        1.0,
        {"raypipe_retrieval": 1.0},
        256,
    )
    assert (r.encode.actors, r.encode.batch_size, r.encode.block_rows) == (16, 1024, 5000)
    assert (r.http.url, r.http.retries, r.serve.max_topk, r.serve.deployment) == (
        "http://10.0.0.5:8000",
        5,
        50,
        "raypipe-retrieval",
    )


def test_every_old_retrieval_key_has_a_new_place():
    """Each flat key of the old file lands somewhere in today's section, and nothing is left over."""
    old = yaml.safe_load(OLD_CONFIG.read_text())["retrieval"]
    new = migrate_tree({"retrieval": old})["retrieval"]
    leaves = sum(len(v) if isinstance(v, dict) else 1 for v in new.values())
    assert leaves == len(old) == 50
    assert new.keys() == load_config().model_dump()["retrieval"].keys()


def test_an_old_run_resumes_under_the_same_settings_and_refuses_others(tmp_path):
    run = old_run(tmp_path)
    check_resumable(load_config("searchr1-7b-gpu", SAME_SETTINGS), run)
    check_resumable(load_config("searchr1-7b-gpu", [*SAME_SETTINGS, "retrieval.actors.replicas=5"]), run)
    with pytest.raises(ConfigError, match=r"retrieval\.index\.nprobe"):
        check_resumable(load_config("searchr1-7b-gpu", [*SAME_SETTINGS, "retrieval.index.nprobe=4"]), run)
    with pytest.raises(ConfigError, match=r"retrieval\.actors\.max_batch_size"):
        check_resumable(load_config("searchr1-7b-gpu", [*SAME_SETTINGS, "retrieval.actors.max_batch_size=8"]), run)


def test_the_report_finds_an_old_runs_settings_under_their_new_names(tmp_path):
    run = old_run(tmp_path)
    tree, used = run_tree(run.path)
    assert used == ["config.yaml"]
    assert lookup(tree, {}, "retrieval.index.type") == "flat"
    assert lookup(tree, {}, "retrieval.encode.block_rows") == 5000


def test_an_old_key_in_set_is_read_as_its_new_one_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        config = load_config("embedded", ["retrieval.nprobe=4", "retrieval.serve_timeout_s=9"])
    assert (config.retrieval.index.nprobe, config.retrieval.serve.timeout_s) == (4, 9.0)
    assert "retrieval.nprobe is now retrieval.index.nprobe" in caplog.text


def test_an_old_key_beside_its_new_one_with_another_value_is_refused(tmp_path):
    preset = tmp_path / "both.yaml"
    preset.write_text(yaml.safe_dump({"extends": "embedded", "retrieval": {"nprobe": 4, "index": {"nprobe": 8}}}))
    with pytest.raises(ConfigError, match=r"retrieval\.nprobe=4 and retrieval\.index\.nprobe=8 are both set"):
        load_config(preset)


def test_a_preset_overlays_sub_sections_key_by_key_and_mappings_whole(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump(
            {"extends": "embedded", "retrieval": {"index": {"nprobe": 8}, "actors": {"resources": {"a": 1}}}}
        )
    )
    top = tmp_path / "top.yaml"
    top.write_text(
        yaml.safe_dump(
            {"extends": str(base), "retrieval": {"index": {"type": "ivf"}, "actors": {"resources": {"b": 2}}}}
        )
    )
    config = load_config(top)
    assert (config.retrieval.index.type, config.retrieval.index.nprobe) == ("ivf", 8)
    assert config.retrieval.actors.resources == {"b": 2.0}
    assert config.retrieval.encode.block_rows == 2000  # the embedded preset's, two levels down

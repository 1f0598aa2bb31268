"""The shared-storage pre-flight (raypipe/runtime/shared_storage.py): its decisions on ``ray.nodes()``-shaped
records without Ray, then the node-pinned check on a local Ray. On the simulated cluster:
tests/test_sim_cluster.py (a run directory on the head's local disk stops the job at its start)."""

import re
from pathlib import Path

import pytest

from raypipe.runtime.shared_storage import (
    MARKER_PREFIX,
    SharedPath,
    SharedStorageError,
    check_shared_storage,
    describe_node,
    missing_line,
    nodes_with,
)

HEAD = {
    "NodeID": "h" * 56,
    "Alive": True,
    "NodeManagerAddress": "10.0.0.1",
    "Resources": {"memory": 1e9, "object_store_memory": 1e8, "node:10.0.0.1": 1, "node:__internal_head__": 1},
}
GPU = {
    "NodeID": "g" * 56,
    "Alive": True,
    "NodeManagerAddress": "10.0.0.2",
    "Resources": {"CPU": 8, "GPU": 2, "raypipe_generation": 2, "accelerator_type:L40S": 1, "memory": 1e9},
}
RETRIEVAL = {
    "NodeID": "r" * 56,
    "Alive": True,
    "NodeManagerAddress": "10.0.0.3",
    "Resources": {"CPU": 4, "GPU": 1, "raypipe_retrieval": 1},
}
DEAD = {**RETRIEVAL, "NodeID": "d" * 56, "Alive": False, "NodeManagerAddress": "10.0.0.4"}


def test_the_nodes_that_need_a_folder_are_the_alive_ones_with_its_resources():
    nodes = [HEAD, GPU, RETRIEVAL, DEAD]
    assert nodes_with(nodes, {}) == [HEAD, GPU, RETRIEVAL]
    assert nodes_with(nodes, {"raypipe_retrieval": 1, "CPU": 0, "GPU": 1}) == [RETRIEVAL]  # zero asks for nothing
    assert nodes_with(nodes, {"GPU": 1}) == [GPU, RETRIEVAL]
    assert nodes_with(nodes, {"raypipe_generation": 3}) == []


def test_a_node_is_named_by_its_ip_and_resources():
    assert describe_node(GPU) == "10.0.0.2 (CPU 8, GPU 2, raypipe_generation 2)"
    assert describe_node(HEAD) == "10.0.0.1 (head, no resources)"


def test_the_message_is_one_line_naming_path_node_and_setting():
    line = missing_line(SharedPath("run directory", Path("/home/me/run"), "--out"), [GPU, RETRIEVAL], 3)
    assert "\n" not in line
    assert line.startswith(
        "run directory /home/me/run is not visible from node 10.0.0.2 (CPU 8, GPU 2, raypipe_generation 2)"
    )
    assert "and 1 more of the 3 nodes checked" in line and "set --out" in line and "docs/cluster.md" in line
    index = SharedPath("retrieval index", Path("/idx"), "retrieval.index.dir", expect="manifest.json")
    assert missing_line(index, [RETRIEVAL], 1).startswith(
        "retrieval index /idx/manifest.json is not visible from node 10.0.0.3"
    )


def test_a_single_node_ray_pays_nothing(tmp_path):
    # one alive node (a dead one does not count): no marker written, no Ray task (Ray is not even started here)
    check_shared_storage([SharedPath("run directory", tmp_path / "run", "--out")], nodes=[HEAD, DEAD])
    assert not (tmp_path / "run").exists()


def test_the_check_runs_on_each_node_and_names_a_missing_file(ray_local, tmp_path):
    import ray

    node = next(n for n in ray.nodes() if n["Alive"])
    twice = [node, {**node, "NodeManagerAddress": "10.9.9.9"}]  # two records of the one real node: the multi-node path
    run = tmp_path / "run"
    check_shared_storage([SharedPath("run directory", run, "--out")], nodes=twice)
    assert run.is_dir() and not list(run.glob(f"{MARKER_PREFIX}*"))  # the marker is gone again
    expected = (
        rf"^retrieval index .*/manifest.json is not visible from node {re.escape(describe_node(node))} and 1 more"
    )
    with pytest.raises(SharedStorageError, match=expected + r" of the 2 nodes checked.*retrieval.index.dir"):
        check_shared_storage(
            [SharedPath("retrieval index", run, "retrieval.index.dir", expect="manifest.json")], nodes=twice
        )


def test_a_stage_checks_ray_storage_path_where_it_is_a_path_not_a_uri(tmp_path):
    from raypipe.core.rundir import RunDir
    from raypipe.runtime.stage_main import shared_paths

    run, other = RunDir(tmp_path / "run"), RunDir(tmp_path / "train-run")
    assert [(p.what, p.setting) for p in shared_paths(run, run, None)] == [("run directory", "RUN_DIR")]
    checked = shared_paths(run, other, "/mnt/raypipe/train")
    assert [(p.path, p.setting) for p in checked] == [
        (run.path, "RUN_DIR"),
        (other.path, "--train-run"),
        (Path("/mnt/raypipe/train"), "ray.storage_path"),
    ]
    assert [p.setting for p in shared_paths(run, None, "s3://bucket/train")] == ["RUN_DIR"]  # Ray reads a URI itself

"""Schema-level checks of the cluster launcher config and the KubeRay manifest (no cloud is reachable)."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from raypipe.core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GENERATION, RETRIEVAL = "raypipe_generation", "raypipe_retrieval"


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def rayjob():
    return yaml.safe_load((ROOT / "k8s" / "rayjob.yaml").read_text())


def test_cluster_yaml_validates_against_rays_schema(cluster):
    from ray.autoscaler._private.util import validate_config

    validate_config(cluster)


def test_cluster_node_types(cluster):
    types = cluster["available_node_types"]
    assert types[cluster["head_node_type"]]["resources"] == {"CPU": 0}, "the head must run no work"
    gpu = types["gpu_worker"]
    assert gpu["resources"]["GPU"] == gpu["resources"][GENERATION] > 0, "one generation slot per GPU"
    assert 0 <= gpu["min_workers"] <= gpu["max_workers"] <= cluster["max_workers"]
    retrieval = types["retrieval_worker"]
    assert retrieval["resources"][RETRIEVAL] >= 1 and GENERATION not in retrieval["resources"]
    assert sum(t.get("max_workers", 0) for t in types.values()) >= cluster["max_workers"] // 2


def test_cluster_installs_the_pinned_gpu_extra(cluster):
    setup = " ".join(cluster["setup_commands"])
    assert "scripts/install.sh" in setup and " gpu" in setup
    pyproject = (ROOT / "pyproject.toml").read_text()
    for pin in ('"vllm==0.33.0"', '"torch==2.14.0"', '"faiss-gpu==1.15.1"', '"ray[data,train,tune,serve,default]==2.60.0"'):
        assert pin in pyproject
    for command in cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]:
        if "ray start" in command:
            assert "RAY_AUTH_MODE=token" in command, "nodes must agree on the authentication mode"
    assert any("auth_token" in target for target in cluster["file_mounts"])


def _submitted_command(entrypoint):
    args = shlex.split(entrypoint)
    assert args[:2] == ["python", "jobs/probe.py"]
    return args


def test_rayjob_shape(rayjob):
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    spec = rayjob["spec"]
    args = _submitted_command(spec["entrypoint"])
    preset = args[args.index("--config") + 1]
    load_config(preset)  # the preset the manifest runs exists and validates
    cluster_spec = spec["rayClusterSpec"]
    assert cluster_spec["rayVersion"] == "2.60.0"
    assert cluster_spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in cluster_spec["workerGroupSpecs"]}
    for group in groups.values():
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        (container,) = group["template"]["spec"]["containers"]
        assert {"requests", "limits"} <= set(container["resources"])
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RAY_AUTH_MODE"] == "token"
    gpu = groups["gpu-generation"]
    custom = json.loads(json.loads(gpu["rayStartParams"]["resources"]))
    gpus = int(gpu["rayStartParams"]["num-gpus"])
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert custom == {GENERATION: gpus} and int(limits["nvidia.com/gpu"]) == gpus
    retrieval = json.loads(json.loads(groups["retrieval"]["rayStartParams"]["resources"]))
    assert retrieval[RETRIEVAL] >= 1 and GENERATION not in retrieval


@pytest.mark.parametrize("preset", ["searchr1-7b-gpu", "r1searcher-7b-gpu"])
def test_gpu_presets_request_the_cluster_resources(cluster, preset):
    """Generation and retrieval actors ask for the custom resources only their node types offer."""
    config = load_config(preset)
    types = cluster["available_node_types"]
    gen, ret = config.generation, config.retrieval
    assert gen.actor_num_gpus == 1 and gen.resources == {GENERATION: 1}
    assert ret.resources == {RETRIEVAL: 1} and ret.faiss_gpu == "shard"
    assert ret.num_gpus <= types["retrieval_worker"]["resources"]["GPU"]
    per_node = types["gpu_worker"]["resources"][GENERATION]
    assert gen.actor_num_cpus * per_node <= 48, "generation actors of one node fit its CPUs"
    assert config.engine.enable_prefix_caching and config.agent.probe


def test_manifest_and_launcher_agree_on_custom_resources(cluster, rayjob):
    launcher = set()
    for node in cluster["available_node_types"].values():
        launcher |= {k for k in node["resources"] if k.startswith("raypipe_")}
    kube = set()
    for group in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        kube |= set(json.loads(json.loads(group["rayStartParams"]["resources"])))
    assert launcher == kube == {GENERATION, RETRIEVAL}

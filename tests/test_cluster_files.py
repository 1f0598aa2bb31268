"""Checks of the cluster launcher config, the KubeRay manifest and the image recipe (no cloud is reachable): Ray's
schema, node shapes, an image with a usable driver and Python on every node type, mounts the ssh user can create,
the shared storage every node mounts and every preset path lives on, and an installer command that works."""

import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from raypipe.core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GENERATION, RETRIEVAL = "raypipe_generation", "raypipe_retrieval"
SHARED = "/mnt/raypipe"
GPU_PRESETS = ["searchr1-7b-gpu", "r1searcher-7b-gpu"]
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
REQUIRES_PYTHON = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def rayjob():
    return yaml.safe_load((ROOT / "k8s" / "rayjob.yaml").read_text())


def _containers(rayjob):
    spec = rayjob["spec"]["rayClusterSpec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [(group, container) for group in groups for container in group["template"]["spec"]["containers"]]


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
    pyproject = (ROOT / "pyproject.toml").read_text()
    for pin in (
        '"vllm==0.33.0"',
        '"torch==2.14.0"',
        '"faiss-gpu==1.15.1"',
        '"ray[data,train,tune,serve,default]==2.60.0"',
    ):
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
        gpus = int(group["rayStartParams"]["num-gpus"])
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == gpus > 0, "every worker pod gets its GPUs"
    gpu = groups["gpu-generation"]
    custom = json.loads(json.loads(gpu["rayStartParams"]["resources"]))
    gpus = int(gpu["rayStartParams"]["num-gpus"])
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert custom == {GENERATION: gpus} and int(limits["nvidia.com/gpu"]) == gpus
    retrieval = json.loads(json.loads(groups["retrieval"]["rayStartParams"]["resources"]))
    assert retrieval[RETRIEVAL] >= 1 and GENERATION not in retrieval


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_presets_request_the_cluster_resources(cluster, preset):
    """Generation and retrieval actors ask for the custom resources only their node types offer."""
    config = load_config(preset)
    types = cluster["available_node_types"]
    gen, ret = config.generation, config.retrieval
    assert gen.actor_num_gpus == 1 and gen.resources == {GENERATION: 1}
    assert ret.actors.resources == {RETRIEVAL: 1} and ret.index.faiss_gpu == "shard"
    assert ret.actors.num_gpus <= types["retrieval_worker"]["resources"]["GPU"]
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


# --- cluster.yaml: nodes that can run the stack ---------------------------------------------------------------------


def test_every_node_type_boots_one_pinned_image_with_a_usable_driver_and_python(cluster):
    """Without an ImageId Ray 2.60 boots its default Ubuntu 18.04 DLAMI (Python 3.6, a CUDA 11-era driver)."""
    images = {name: node["node_config"].get("ImageId") for name, node in cluster["available_node_types"].items()}
    assert all(images.values()), f"node types without an image: {[n for n, i in images.items() if not i]}"
    assert len(set(images.values())) == 1, "one image for every node type: one driver, one Python"
    text = (ROOT / "cluster.yaml").read_text()
    assert DLAMI_PARAMETER in text, "the comment names the SSM parameter that gives the id"
    assert "Python 3.12" in text and "r580" in text  # the image's Python and driver, named with the reason
    assert "3.12" in REQUIRES_PYTHON


def test_file_mounts_are_paths_the_ssh_user_creates(cluster):
    """file_mounts are synced by the ssh user, without sudo, before initialization_commands run."""
    home = f"/home/{cluster['auth']['ssh_user']}/"
    outside = [target for target in cluster["file_mounts"] if not target.startswith(home)]
    assert not outside, f"file_mounts outside {home}: {outside}"


def _mount_command(cluster):
    (command,) = [c for c in cluster["initialization_commands"] if f" {SHARED} nfs4" in c]
    return command


def test_shared_storage_is_mounted_on_every_node(cluster):
    """An EFS (NFS 4.1) filesystem at /mnt/raypipe, mounted with sudo by the top-level initialization_commands,
    which every node type runs (none overrides them), and remounted from fstab when a stopped node starts again."""
    command = _mount_command(cluster)
    assert "sudo mount" in command and "nfsvers=4.1" in command and "/etc/fstab" in command
    assert f"REGION={cluster['provider']['region']}" in command, "the EFS name is in the cluster's region"
    assert not any("initialization_commands" in node for node in cluster["available_node_types"].values())
    folders = " ".join(cluster["initialization_commands"])
    for folder in ("data", "models", "index", "runs", "train"):
        assert f"{SHARED}/{folder}" in folders


def _run_initialization(cluster, tmp_path, replace=None):
    """The initialization commands under bash with sudo, mountpoint and dpkg stood in for (they record calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    # sudo records its command; `sudo tee -a FILE` writes what it is given to tmp_path/tee instead of FILE.
    for tool, body in {
        "sudo": f'echo "sudo $*" >> {log}; [ "$1" != tee ] || cat >> {tmp_path / "tee"}',
        "mountpoint": "exit 1",
        "dpkg": "exit 0",
    }.items():
        (bin_dir / tool).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    results = []
    for command in cluster["initialization_commands"]:
        if replace:
            command = command.replace(*replace)
        results.append(subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30))
    return results, (log.read_text().splitlines() if log.exists() else [])


def test_the_mount_command_refuses_an_unset_filesystem_id(cluster, tmp_path):
    results, calls = _run_initialization(cluster, tmp_path)
    mount = results[cluster["initialization_commands"].index(_mount_command(cluster))]
    assert mount.returncode == 1 and "sets no EFS filesystem id" in mount.stderr
    assert not any(" mount " in f" {call} " for call in calls)


def test_the_mount_command_mounts_the_filesystem_it_is_given(cluster, tmp_path):
    placeholder = re.search(r"EFS=(\S+)", _mount_command(cluster)).group(1)
    results, calls = _run_initialization(cluster, tmp_path, replace=(f"EFS={placeholder}", "EFS=fs-0123abcd"))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    region = cluster["provider"]["region"]
    assert "sudo tee -a /etc/fstab" in calls and f"sudo mount {SHARED}" in calls
    (line,) = (tmp_path / "tee").read_text().splitlines()
    device, mount_point, kind, options, *_ = line.split()
    assert (device, mount_point, kind) == (f"fs-0123abcd.efs.{region}.amazonaws.com:/", SHARED, "nfs4")
    assert {"nfsvers=4.1", "hard", "_netdev", "nofail"} <= set(options.split(","))
    assert any(call.startswith("sudo install -d -o ubuntu") and f"{SHARED}/runs" in call for call in calls)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_presets_keep_every_path_on_the_shared_storage(preset, rayjob):
    """The head runs no work: whatever a task or actor on another node reads or writes must be on the shared mount."""
    paths = []

    def walk(value, key=""):
        if isinstance(value, dict):
            for name, item in value.items():
                walk(item, name)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)
        elif isinstance(value, str) and value.startswith("/") and key != "route_prefix":  # an HTTP route, not a file
            paths.append(value)

    walk(load_config(preset).model_dump())
    assert paths, "the preset names its data, models and index"
    assert all(path.startswith(f"{SHARED}/") for path in paths), [p for p in paths if not p.startswith(SHARED)]
    args = shlex.split(rayjob["spec"]["entrypoint"])
    assert args[args.index("--out") + 1].startswith(f"{SHARED}/runs/")


def test_setup_runs_the_installer_with_the_images_python(cluster):
    """The installer makes the environment with a Python that requires-python accepts, for the gpu extra."""
    commands = [c for c in cluster["setup_commands"] if "scripts/install.sh" in c]
    assert len(commands) == 1
    args = shlex.split(commands[0].split("&&")[-1])
    python = dict(a.split("=", 1) for a in args if re.fullmatch(r"[A-Z_]+=\S+", a)).get("PYTHON", "")
    assert re.fullmatch(r"python3\.\d+", python) and python.removeprefix("python") in REQUIRES_PYTHON
    script = args.index("scripts/install.sh")
    assert args[script - 1] == "bash" and args[script + 2] == "gpu"
    assert (ROOT / "scripts" / "install.sh").exists()
    for command in (
        *cluster["initialization_commands"],
        *cluster["setup_commands"],
        *cluster["head_start_ray_commands"],
        *cluster["worker_start_ray_commands"],
    ):
        assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command


# --- Kubernetes: token, shared volume, image ------------------------------------------------------------------------


def test_rayjob_carries_the_token_through_auth_options(rayjob):
    """KubeRay's submitter gets a token only from rayClusterSpec.authOptions (KubeRay >= 1.5.1); the operator sets
    RAY_AUTH_MODE and the token on every pod, so no container sets them itself."""
    auth = rayjob["spec"]["rayClusterSpec"]["authOptions"]
    assert auth["mode"] == "token"
    header = (ROOT / "k8s" / "rayjob.yaml").read_text()
    assert f"kubectl create secret generic {auth['secretName']} --from-file=auth_token=" in header
    for _, container in _containers(rayjob):
        assert not {e["name"] for e in container.get("env", [])} & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"}


def test_rayjob_mounts_the_shared_claim_on_every_pod(rayjob):
    claim = yaml.safe_load((ROOT / "k8s" / "storage.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for group, container in _containers(rayjob):
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SHARED]
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_rayjob_runs_the_image_the_recipe_builds(rayjob):
    recipe = (ROOT / "docker" / "Dockerfile").read_text()
    tag = re.search(r"docker build -f docker/Dockerfile -t (\S+) \.", recipe).group(1)
    assert {container["image"] for _, container in _containers(rayjob)} == {tag}
    base = re.search(r"^FROM (\S+)", recipe, re.M).group(1)
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-base-ubuntu24\.04", base), "CUDA 13 for torch 2.14.0"
    install = re.search(r"PYTHON=python(3\.\d+) bash scripts/install\.sh (\S+) gpu", recipe)
    assert install and install.group(1) in REQUIRES_PYTHON
    assert f"ENV PATH={install.group(2)}/bin:" in recipe, "ray, python and raypipe from the installed environment"
    for copied in re.findall(r"^COPY (.+) \S+$", recipe, re.M):
        for path in copied.split():
            assert (ROOT / path).exists(), path
    working_dir = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["working_dir"]
    assert re.search(rf"^WORKDIR {working_dir}$", recipe, re.M)


def test_runbook_edits_what_the_files_hold(cluster):
    """docs/cluster.md's commands fill the placeholders cluster.yaml has and submit jobs that exist."""
    runbook = (ROOT / "docs" / "cluster.md").read_text()
    image = cluster["available_node_types"]["head"]["node_config"]["ImageId"]
    efs = re.search(r"EFS=(\S+)", _mount_command(cluster)).group(1)
    assert f'sed -i "s/{image}/$AMI/" cluster.yaml' in runbook
    assert f'sed -i "s/EFS={efs}/EFS=$FS/" cluster.yaml' in runbook
    assert DLAMI_PARAMETER in runbook
    for job in set(re.findall(r"python (jobs/\w+\.py)", runbook)):
        assert (ROOT / job).exists(), job
    for target in re.findall(r"\]\(\.\./([^)#]+)\)", runbook):
        assert (ROOT / target).exists(), target

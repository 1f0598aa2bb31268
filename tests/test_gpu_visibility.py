"""GPUs are hidden from the Ray workers that asked for none (raypipe.runtime.cluster.init_ray), and a
tensor-parallel engine needs as many GPUs in its actor (RunConfig)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypipe.core.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]

# A local Ray started by init_ray, with two fake GPUs (ray.init's num_gpus, added around init_ray's call);
# a task and an actor without GPUs and an actor with one report the CUDA_VISIBLE_DEVICES they see.
SCRIPT = """
import json, os, ray
from raypipe.core.config import load_config
from raypipe.runtime.cluster import init_ray

start = ray.init
ray.init = lambda **kw: start(num_gpus=2, object_store_memory=100_000_000, **kw)
init_ray(load_config("embedded", ["ray.num_cpus=2"]), log_to_driver=False)

@ray.remote(num_cpus=0)
def task():
    return os.environ.get("CUDA_VISIBLE_DEVICES")

@ray.remote(num_cpus=0)
class Actor:
    def visible(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES")

cpu, gpu = Actor.remote(), Actor.options(num_gpus=1).remote()
print(json.dumps({"task": ray.get(task.remote()), "cpu_actor": ray.get(cpu.visible.remote()),
                  "gpu_actor": ray.get(gpu.visible.remote()), "gpu_ids": ray.get_gpu_ids()}))
ray.shutdown()
"""


def test_zero_gpu_workers_see_no_gpu_on_a_gpu_node(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")
    }
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["task"] == "" and seen["cpu_actor"] == ""  # not unset: CUDA would show them every GPU
    assert seen["gpu_actor"] in ("0", "1")


@pytest.mark.parametrize("setting", ["generation.actor_num_gpus", "serve_agent.num_gpus"])
def test_tensor_parallel_engine_needs_its_gpus_in_the_actor(setting):
    with pytest.raises(ConfigError) as err:
        load_config("embedded", ["engine.tensor_parallel_size=2", f"{setting}=1"])
    assert str(err.value).splitlines()[1] == (
        f"  engine.tensor_parallel_size=2 needs 2 GPUs in each engine's actor, {setting}=1 gives it 1: "
        f"set {setting}=2 or lower engine.tensor_parallel_size"
    )
    load_config("embedded", ["engine.tensor_parallel_size=2", f"{setting}=2"])
    load_config("embedded", ["engine.tensor_parallel_size=2"])  # no GPUs: vLLM's tensor parallelism on CPUs
    load_config("embedded", ["engine.tensor_parallel_size=2", f"{setting}=1", "engine.backend=transformers"])

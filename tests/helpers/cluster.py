"""A throwaway multi-node Ray cluster on loopback, driven through the ``ray`` CLI as users drive one.

Each node is a ``ray start --block`` process: terminating it stops that node's Ray processes, so a test
never needs ``ray stop`` (which would stop every Ray instance on the machine). The cluster has its own
``--temp-dir``, so ``ray.init()`` elsewhere on the machine does not find and join it, and token
authentication on (Ray 2.60's default for ``ray start --head``) with its own token file, which the
nodes and the job client share through ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN_PATH``.

The simulated GPU cluster (:func:`simulated_gpu_cluster`, the ``sim_cluster`` fixture of tests/conftest.py)
is cluster.yaml's shape on CPUs: a head with 0 CPUs that runs only the job's driver (``ray job submit``), a
``gpu_worker`` and a ``retrieval_worker`` (:data:`NODE_TYPES`: fake GPUs through ``ray start --num-gpus``,
so Ray sets each GPU actor's ``CUDA_VISIBLE_DEVICES``, and the presets' custom resources). Each worker runs
in its own mount namespace with a private tmpfs over :attr:`LocalCluster.local`: a path there is each node's
own "local disk" (the head, in the test's namespace, sees its own; a worker sees an empty folder that only
it writes), while :attr:`LocalCluster.shared` is the one folder every node sees, as a shared mount would
be (the rest of the host's filesystem, the model cache included, stays common to all nodes). Helpers:

- ``cluster.submit_job(id, ROOT, [python, jobs/probe.py, ...])``: ``ray job submit`` (driver on the head),
  its output and final status; ``cluster.nodes_info()``: ``ray.nodes()`` records (``NodeID``, ``Alive``,
  ``Resources``); ``node_type_of(record)``: which of :data:`NODE_TYPES` a record is (``head`` for the head).
- ``cluster.add_node(...)`` / ``cluster.add_worker(node_type)``: one more node (its own agent ports, its
  own mount namespace when ``private_local``); ``cluster.kill_node(i)``: a node lost as to a spot
  preemption (every process of it SIGKILLed, raylet first) and waits until Ray marks it dead.

Every wait is bounded and fails with what it waited for and where the node logs are.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
AGENT_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
# cluster.yaml's worker node types, scaled to this machine (GPUs are fake: Ray's --num-gpus)
NODE_TYPES = {
    "gpu_worker": {"num_cpus": 2, "num_gpus": 2, "resources": {"raypipe_generation": 2}},
    "retrieval_worker": {"num_cpus": 1, "num_gpus": 1, "resources": {"raypipe_retrieval": 1}},
}
NODE_DEATH_TIMEOUT_S = 120  # Ray's health check marks a silent node dead after ~15-30 s


def cache_env() -> dict[str, str]:
    """The tests' cache and offline switches, for a cluster's jobs (their models and indexes are the tests' own)."""
    names = ("RAYPIPE_CACHE", "VLLM_CACHE_ROOT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return {k: os.environ[k] for k in names if k in os.environ}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    def __init__(self, extra_env: dict[str, str] | None = None):
        # short: Ray's unix socket paths live under the temp dir and must stay under 108 characters
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rpc-", dir="/tmp"))
        token = self.temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = {**os.environ, **(extra_env or {}), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self.env.pop("RAY_ADDRESS", None)
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.nodes: list[subprocess.Popen] = []
        self.dead: set[int] = set()  # indexes in nodes killed by kill_node
        self.worker_types: dict[int, str] = {}  # index in nodes -> node type, for workers added by add_worker
        self.local = self.temp_dir / "local"  # each node's own folder (private_local workers: a tmpfs of their own)
        self.shared = self.temp_dir / "shared"  # the folder every node sees
        for folder in (self.local, self.shared):
            folder.mkdir()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start_head(self, num_cpus: int, resources: dict[str, float] | None = None) -> None:
        self._start_node(
            [
                "--head",
                f"--port={self.gcs_port}",
                f"--temp-dir={self.temp_dir}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
            ],
            num_cpus,
            resources,
        )
        self._wait(
            lambda: self.ray("job", "list", "--address", self.dashboard, check=False).returncode == 0, "the head"
        )

    def add_node(
        self, num_cpus: int, resources: dict[str, float] | None = None, num_gpus: int = 0, private_local: bool = False
    ) -> int:
        """Start a worker node and wait until it is alive; returns its index in ``nodes``. ``private_local``:
        in its own mount namespace, with a tmpfs of its own over :attr:`local`."""
        expected = len(self.nodes) - len(self.dead) + 1
        self._start_node([f"--address={self.address}"], num_cpus, resources, num_gpus, private_local)
        self._wait(lambda: self.alive_nodes() == expected, f"node {len(self.nodes) - 1}")
        return len(self.nodes) - 1

    def add_worker(self, node_type: str) -> int:
        """A worker of one of :data:`NODE_TYPES`, with its own local disk."""
        index = self.add_node(**NODE_TYPES[node_type], private_local=True)
        self.worker_types[index] = node_type
        return index

    def _start_node(
        self,
        args: list[str],
        num_cpus: int,
        resources: dict[str, float] | None,
        num_gpus: int = 0,
        private_local: bool = False,
    ) -> None:
        # every node on this host needs its own agent ports (the defaults clash with each other and
        # with any other Ray instance on the machine)
        ports = [f"--{name}={free_port()}" for name in AGENT_PORTS]
        cmd = [
            RAY,
            "start",
            "--block",
            *args,
            "--node-ip-address=127.0.0.1",
            *ports,
            f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}",
            "--object-store-memory=400000000",
            f"--resources={json.dumps(resources or {})}",
        ]
        if private_local:  # a mount namespace of its own: the tmpfs over `local` is this node's alone
            mount = f'mount -t tmpfs -o size=512m tmpfs {self.local} && exec "$@"'
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", *cmd]
        log = (self.temp_dir / f"node-{len(self.nodes)}.log").open("w")
        self.nodes.append(
            subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def nodes_info(self) -> list[dict]:
        """``ray.nodes()`` of the cluster (from a short-lived driver)."""
        script = "import json, ray; ray.init(log_to_driver=False); print('NODES', json.dumps(ray.nodes()))"
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env={**self.env, "RAY_ADDRESS": self.address},
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("NODES ")]  # not the raylets' lines
        return json.loads(lines[-1].removeprefix("NODES ")) if proc.returncode == 0 and lines else []

    def alive_nodes(self) -> int:
        return sum(n["Alive"] for n in self.nodes_info())

    def kill_node(self, index: int) -> None:
        """Lose worker ``index`` as to a spot preemption: SIGKILL its raylet, then every other process of the
        node (agents, workers, their vLLM engine processes), and wait until Ray marks the node dead."""
        expected = len(self.nodes) - len(self.dead) - 1
        root = psutil.Process(self.nodes[index].pid)
        tree = [root, *root.children(recursive=True)]
        for proc in sorted(tree, key=lambda p: "raylet" not in " ".join(_cmdline(p))):  # the raylet first
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        self.nodes[index].wait(timeout=30)
        self.dead.add(index)
        self._wait(lambda: self.alive_nodes() == expected, f"Ray to mark node {index} dead", NODE_DEATH_TIMEOUT_S)

    def ray(
        self, *args: str, check: bool = True, timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"ray {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return proc

    def submit_job(
        self, submission_id: str, working_dir: Path, entrypoint: list[str], timeout: float = 900, wait: bool = True
    ) -> tuple[str, str]:
        """``ray job submit`` (waits for the end unless not ``wait``: see :meth:`wait_job`): (its output, the
        job's status line)."""
        deadline = time.monotonic() + 120
        while True:
            proc = self.ray(
                "job",
                "submit",
                "--address",
                self.dashboard,
                "--submission-id",
                submission_id,
                *(() if wait else ("--no-wait",)),
                "--working-dir",
                str(working_dir),
                "--",
                *entrypoint,
                check=False,
                timeout=timeout,
            )
            # the head's job agent comes up a little after its dashboard answers
            if "No available agent" not in proc.stdout + proc.stderr or time.monotonic() > deadline:
                break
            time.sleep(5)
        status = self.ray("job", "status", "--address", self.dashboard, submission_id, check=False)
        return proc.stdout + proc.stderr, status.stdout + status.stderr

    def wait_job(self, submission_id: str, timeout: float = 900) -> tuple[str, str]:
        """Wait for a job submitted with ``wait=False`` to end: (its logs, its final status line)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.ray("job", "status", "--address", self.dashboard, submission_id, check=False)
            text = status.stdout + status.stderr
            if any(f"Job '{submission_id}' {end}" in text for end in ("succeeded", "failed", "stopped")):
                break
            if time.monotonic() > deadline:
                self.ray("job", "stop", "--address", self.dashboard, submission_id, check=False)
                raise TimeoutError(f"job {submission_id} did not end within {timeout:.0f} s: {text.strip()}")
            time.sleep(3)
        logs = self.ray("job", "logs", "--address", self.dashboard, submission_id, check=False)
        return logs.stdout + logs.stderr, text

    def _wait(self, ready, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(node.poll() is not None for i, node in enumerate(self.nodes) if i not in self.dead):
                raise RuntimeError(f"a Ray node exited while waiting for {what}: see {self.temp_dir}/node-*.log")
            if ready():
                return
            time.sleep(2)
        raise TimeoutError(f"{what} did not come up within {timeout:.0f} s: see {self.temp_dir}/node-*.log")

    def stop(self) -> None:
        for node in reversed(self.nodes):  # workers first, then the head
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
                try:
                    node.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(node.pid, signal.SIGKILL)
                    node.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def node_type_of(node: dict) -> str:
    """Which of :data:`NODE_TYPES` a ``ray.nodes()`` record is, by its custom resources (``head`` for the head)."""
    resources = node["Resources"]
    if "node:__internal_head__" in resources:
        return "head"
    return next(
        (name for name, shape in NODE_TYPES.items() if all(r in resources for r in shape["resources"])), "other"
    )


@contextmanager
def simulated_gpu_cluster(
    extra_env: dict[str, str] | None = None, workers: tuple[str, ...] = ("gpu_worker", "retrieval_worker")
) -> Iterator[LocalCluster]:
    """A head with 0 CPUs and one worker of each of ``workers`` (module docstring); stopped on exit."""
    cluster = LocalCluster(extra_env)
    try:
        cluster.start_head(num_cpus=0)
        for node_type in workers:
            cluster.add_worker(node_type)
        yield cluster
    finally:
        cluster.stop()

"""A throwaway multi-node Ray cluster on loopback, driven through the ``ray`` CLI as users drive one.

Each node is a ``ray start --block`` process: terminating it stops that node's Ray processes, so a test
never needs ``ray stop`` (which would stop every Ray instance on the machine). The cluster has its own
``--temp-dir``, so ``ray.init()`` elsewhere on the machine does not find and join it, and token
authentication on (Ray 2.60's default for ``ray start --head``) with its own token file, which the
nodes and the job client share through ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN_PATH``.
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
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
AGENT_PORTS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")


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

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start_head(self, num_cpus: int, resources: dict[str, float] | None = None) -> None:
        self._start_node(
            ["--head", f"--port={self.gcs_port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}"],
            num_cpus, resources,
        )  # fmt: skip
        self._wait(lambda: self.ray("job", "list", "--address", self.dashboard, check=False).returncode == 0, "the head")

    def add_node(self, num_cpus: int, resources: dict[str, float] | None = None) -> None:
        expected = len(self.nodes) + 1
        self._start_node([f"--address={self.address}"], num_cpus, resources)
        self._wait(lambda: self.alive_nodes() == expected, f"node {expected}")

    def _start_node(self, args: list[str], num_cpus: int, resources: dict[str, float] | None) -> None:
        # every node on this host needs its own agent ports (the defaults clash with each other and
        # with any other Ray instance on the machine)
        ports = [f"--{name}={free_port()}" for name in AGENT_PORTS]
        cmd = [RAY, "start", "--block", *args, "--node-ip-address=127.0.0.1", *ports, f"--num-cpus={num_cpus}",
               "--object-store-memory=400000000", f"--resources={json.dumps(resources or {})}"]  # fmt: skip
        log = (self.temp_dir / f"node-{len(self.nodes)}.log").open("w")
        self.nodes.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def alive_nodes(self) -> int:
        script = "import ray; ray.init(); print(sum(n['Alive'] for n in ray.nodes()))"
        proc = subprocess.run([sys.executable, "-c", script], env={**self.env, "RAY_ADDRESS": self.address},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0

    def ray(self, *args: str, check: bool = True, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def submit_job(self, submission_id: str, working_dir: Path, entrypoint: list[str], timeout: float = 900) -> tuple[str, str]:
        """``ray job submit`` (waits for the end): (its output, the job's final status line)."""
        deadline = time.monotonic() + 120
        while True:
            proc = self.ray("job", "submit", "--address", self.dashboard, "--submission-id", submission_id,
                            "--working-dir", str(working_dir), "--", *entrypoint, check=False, timeout=timeout)  # fmt: skip
            # the head's job agent comes up a little after its dashboard answers
            if "No available agent" not in proc.stdout + proc.stderr or time.monotonic() > deadline:
                break
            time.sleep(5)
        status = self.ray("job", "status", "--address", self.dashboard, submission_id, check=False)
        return proc.stdout + proc.stderr, status.stdout + status.stderr

    def _wait(self, ready, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
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

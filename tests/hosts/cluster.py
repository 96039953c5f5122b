"""Plinth on the multi-host bed (bed.py): a Ray head and the control plane on h1, Ray worker
nodes with fake GPUs on the other hosts, and the `plinth` CLI run from any host.

The Ray cluster uses token authentication with a token of its own (from the OS CSPRNG), so no
process on the bed joins it by chance. The head offers no CPUs or GPUs: work lands on the worker
hosts, as on a cluster whose head node is kept for its control services. Every Ray port is set
(each host has its own network namespace, so the same numbers serve every host).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bed import Bed

VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
PLINTH = str(VENV_BIN / "plinth")
RAY_PORT = 6379
API_PORT = 8642
HOME = "/tmp/plinth-home"  # the control plane's, in h1's private /tmp
OBJECT_STORE = 80 * 2**20
HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
PORTS = ["--node-manager-port", "6380", "--object-manager-port", "6381",
         "--metrics-export-port", "6382", "--dashboard-agent-listen-port", "6383",
         "--dashboard-agent-grpc-port", "6384", "--runtime-env-agent-port", "6385",
         "--min-worker-port", "20000", "--max-worker-port", "20200"]


@dataclass(frozen=True)
class Worker:
    host: str
    gpus: int = 2
    cpus: int = 4
    model: str = "A100"
    rack: str = "r1"


class PlinthBed:
    """The bed with Ray and `plinth up` on it; `cli(host, ...)` runs the plinth CLI."""

    def __init__(self, hosts: int = 3, workers: tuple[Worker, ...] | None = None) -> None:
        self.bed = Bed(hosts)
        self.workers = workers or tuple(Worker(f"h{i}", rack=f"r{i}")
                                        for i in range(2, hosts + 1))
        token = self.bed.root / "ray.token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.head = self.bed.hosts["h1"].address
        self.server = f"http://{self.head}:{API_PORT}"
        self.jobs_dir = self.bed.shared / "jobs"
        self.plane: subprocess.Popen | None = None
        self.token = ""

    @property
    def shared(self) -> Path:
        return self.bed.shared

    def up(self) -> PlinthBed:
        self.bed.up()
        self.ray("h1", "--head", "--port", str(RAY_PORT), "--num-cpus", "0", "--num-gpus", "0",
                 "--include-dashboard", "false", "--ray-client-server-port", "10001",
                 "--system-config", json.dumps(HEALTH), "--labels", "plinth-node=h1")
        for w in self.workers:
            self.join(w)
        self.jobs_dir.mkdir(mode=0o755)
        self.start_plane()
        return self

    def ray(self, host: str, *args: str) -> None:
        """`ray start` on `host` at its own address."""
        self.bed.sh(host, [RAY, "start", "--node-ip-address", self.bed.hosts[host].address,
                           "--object-store-memory", str(OBJECT_STORE), "--disable-usage-stats",
                           *PORTS, *args], env=self.env)

    def join(self, w: Worker) -> None:
        """A Ray worker node on host `w.host` (booted again first if it was killed)."""
        if self.bed.hosts[w.host].anchor is None:
            self.bed.start_host(w.host)
        self.ray(w.host, "--address", f"{self.head}:{RAY_PORT}", "--num-cpus", str(w.cpus),
                 "--num-gpus", str(w.gpus),
                 "--resources", json.dumps({f"accelerator_type:{w.model}": 1}),
                 "--labels", f"plinth-node={w.host},rack={w.rack}")

    def start_plane(self, *extra: str) -> None:
        """`plinth up` on h1, bound to h1's address, on the Ray cluster."""
        log = open(self.bed.root / "plane.log", "ab")  # noqa: SIM115 -- the child's
        self.plane = self.bed.run("h1", [
            PLINTH, "up", "--home", HOME, "--host", self.head, "--port", str(API_PORT),
            "--runtime", "ray", "--ray-address", f"{self.head}:{RAY_PORT}",
            "--jobs-dir", str(self.jobs_dir), "--grace", "2", "--min-runtime", "0", *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 120
        while True:
            done = self.bed.sh("h1", [PLINTH, "nodes", "--server", self.server, "--token", "-"],
                               check=False)
            if "401" in done.stderr + done.stdout or done.returncode == 0:
                break  # it answers (without a token, with 401)
            if self.plane.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"plinth up on h1 did not start: {self.plane_log()[-2000:]}")
            time.sleep(0.2)
        self.token = self.bed.sh("h1", ["cat", f"{HOME}/token"]).stdout.strip()

    def plane_log(self) -> str:
        return (self.bed.root / "plane.log").read_text(errors="replace")

    def cli(self, host: str, *args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        """`plinth ARGS` run on `host` against the control plane on h1."""
        env = {**self.env, "PLINTH_SERVER": self.server, "PLINTH_TOKEN": self.token}
        return self.bed.sh(host, [PLINTH, *args], env=env, check=check, timeout=timeout)

    def api(self, host: str, path: str) -> Any:
        """GET `path` of the control plane's API from `host`, as the admin; the JSON answer."""
        code = ("import os, sys, httpx; r = httpx.get(os.environ['PLINTH_SERVER'] + sys.argv[1], "
                "headers={'Authorization': 'Bearer ' + os.environ['PLINTH_TOKEN']}, timeout=30); "
                "r.raise_for_status(); print(r.text)")
        env = {**self.env, "PLINTH_SERVER": self.server, "PLINTH_TOKEN": self.token}
        return json.loads(self.bed.sh(host, [sys.executable, "-c", code, path], env=env).stdout)

    def down(self) -> None:
        self.bed.down()

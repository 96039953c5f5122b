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
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bed import Bed, wait_for

VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
PLINTH = str(VENV_BIN / "plinth")
RAY_PORT = 6379
API_PORT = 8642
HOME = "/tmp/plinth-home"  # the control plane's, in h1's private /tmp
OBJECT_STORE = 80 * 2**20
# The head declares a node dead after some 10 failed health checks, one a second; a node's
# jobs fence themselves after 4 s without the head (plinth up --fence-after).
HEALTH = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
          "health_check_failure_threshold": 10}
FENCE_AFTER_S = 4
RAYLET_PORT = 6380
PORTS = ["--node-manager-port", str(RAYLET_PORT), "--object-manager-port", "6381",
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
        # Not the loopback switch that tests/runtime/ray_cluster.py sets in this process (a
        # test run imports both): with it, `ray start --address` refuses to join.
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.head = self.bed.hosts["h1"].address
        self.server = f"http://{self.head}:{API_PORT}"
        self.jobs_dir = self.bed.shared / "jobs"
        self.plane: subprocess.Popen | None = None
        self.token = ""

    @property
    def shared(self) -> Path:
        return self.bed.shared

    def up(self, plane: bool = True) -> PlinthBed:
        """The hosts, Ray on them, and (`plane`) the control plane on h1."""
        self.bed.up()
        self.ray("h1", "--head", "--port", str(RAY_PORT), "--num-cpus", "0", "--num-gpus", "0",
                 "--include-dashboard", "false", "--ray-client-server-port", "10001",
                 "--system-config", json.dumps(HEALTH), "--labels", "plinth-node=h1")
        for w in self.workers:
            self.join(w)
        self.wait_ray_nodes(1 + len(self.workers))
        self.jobs_dir.mkdir(mode=0o755)
        if plane:
            self.start_plane()
        return self

    def ray(self, host: str, *args: str) -> None:
        """`ray start` on `host` at its own address."""
        self.bed.sh(host, [RAY, "start", "--node-ip-address", self.bed.hosts[host].address,
                           "--object-store-memory", str(OBJECT_STORE), "--disable-usage-stats",
                           *PORTS, *args], env=self.env)

    def join(self, w: Worker) -> None:
        """A Ray worker node on host `w.host` (booted again first if it was killed), kept up
        as systemd would keep it: started again whenever its raylet is not running (Ray ends
        the raylet of a node the head declared dead, once it hears of it)."""
        if self.bed.hosts[w.host].anchor is None:
            self.bed.start_host(w.host)
        start = " ".join(shlex.quote(a) for a in [
            RAY, "start", "--node-ip-address", self.bed.hosts[w.host].address,
            "--object-store-memory", str(OBJECT_STORE), "--disable-usage-stats", *PORTS,
            "--address", f"{self.head}:{RAY_PORT}", "--num-cpus", str(w.cpus),
            "--num-gpus", str(w.gpus),
            "--resources", json.dumps({f"accelerator_type:{w.model}": 1}),
            "--labels", f"plinth-node={w.host},rack={w.rack}"])
        raylet_up = f"ss -Hltn 'sport = :{RAYLET_PORT}' | grep -q ."
        log = open(self.bed.root / f"ray-{w.host}.log", "ab")  # noqa: SIM115 -- the child's
        self.bed.run(w.host, ["sh", "-c", f"while :; do {raylet_up} || {start}; sleep 1; done"],
                     env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def ray_nodes(self) -> int:
        """How many nodes the Ray head counts alive."""
        out = self.bed.sh("h1", [RAY, "status", "--address", f"{self.head}:{RAY_PORT}"],
                          env=self.env, check=False).stdout
        active = out.split("Active:", 1)[-1].split("Pending:", 1)[0]
        return sum(1 for line in active.splitlines() if line.strip().startswith("1 node_"))

    def wait_ray_nodes(self, n: int, timeout: float = 120) -> None:
        wait_for(lambda: self.ray_nodes() == n, f"the Ray head to count {n} nodes alive",
                 timeout)

    def start_plane(self, *extra: str) -> None:
        """`plinth up` on h1, bound to h1's address, on the Ray cluster."""
        log = open(self.bed.root / "plane.log", "ab")  # noqa: SIM115 -- the child's
        self.plane = self.bed.run("h1", [
            PLINTH, "up", "--home", HOME, "--host", self.head, "--port", str(API_PORT),
            "--runtime", "ray", "--ray-address", f"{self.head}:{RAY_PORT}",
            "--jobs-dir", str(self.jobs_dir), "--grace", "2", "--min-runtime", "0",
            "--fence-after", str(FENCE_AFTER_S), *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        def answers() -> bool:  # (without a token, with 401)
            if self.plane.poll() is not None:
                raise RuntimeError(f"plinth up on h1 exited: {self.plane_log()[-2000:]}")
            done = self.bed.sh("h1", [PLINTH, "nodes", "--server", self.server, "--token", "-"],
                               check=False)
            return "401" in done.stderr + done.stdout or done.returncode == 0

        wait_for(answers, "plinth up on h1 to answer", timeout=120)
        self.token = self.bed.sh("h1", ["cat", f"{HOME}/token"]).stdout.strip()

    def plane_log(self) -> str:
        return (self.bed.root / "plane.log").read_text(errors="replace")

    def cli(self, host: str, *args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        """`plinth ARGS` run on `host` against the control plane on h1."""
        env = {**self.env, "PLINTH_SERVER": self.server, "PLINTH_TOKEN": self.token}
        return self.bed.sh(host, [PLINTH, *args], env=env, check=check, timeout=timeout)

    def api(self, host: str, path: str) -> Any:
        """GET `path` of the control plane's API from `host`, with the admin's token; its
        JSON (e.g. /v1/workloads/NAME: a service's status and units)."""
        code = ("import httpx, os, sys; r = httpx.get(os.environ['PLINTH_SERVER'] + sys.argv[1], "
                "headers={'Authorization': 'Bearer ' + os.environ['PLINTH_TOKEN']}, timeout=30); "
                "r.raise_for_status(); print(r.text)")
        env = {**self.env, "PLINTH_SERVER": self.server, "PLINTH_TOKEN": self.token}
        return json.loads(self.bed.sh(host, [sys.executable, "-c", code, path], env=env).stdout)

    def down(self) -> None:
        self.bed.down()

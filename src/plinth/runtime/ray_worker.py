"""The node side of the Ray runtime (plinth.runtime.ray): the actor that runs one worker.

RayRuntime makes WorkerActor a Ray actor (named and detached) in the worker's bundle of its
attempt's placement group, so it runs on the node the scheduler chose and outlives the control
plane that made it. It starts the worker through the local runtime's shim (plinth/runtime/shim.py)
in a session of its own, waits for it, relays signals to it, and keeps its output on the node,
where the node's NodeLogs actor hands it over (plinth.runtime.ray_logs). Only the standard library, psutil and Plinth are imported at the top:
the module is imported in every Ray worker process that hosts an actor.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil

from plinth.core.errors import PlinthError
from plinth.core.runtime import NODE_ADDRESS
from plinth.runtime.local import INHERITED_ENV
from plinth.runtime.procs import LOG_LIMIT_MIB, killpg, start_shim, user_env, user_ids
from plinth.runtime.ray_logs import worker_dir

FENCE_POLL_S = 1.0  # how often an actor looks at its raylet and the Ray head


class WorkerActor:
    """One worker of an attempt, on the node of its bundle: it starts the worker's shim in a
    session of its own, waits for it, relays signals to it, and keeps its output in its folder
    on the node until the control plane has taken it. Made a Ray actor by RayRuntime (ray.remote), named and detached, so
    that it outlives the control plane that made it."""

    def __init__(self, job_id: int, attempt: int, rank: int, fence_after_s: float = 0.0
                 ) -> None:
        """`fence_after_s`: kill the worker, and end this actor's process, once the Ray head
        has been out of reach that long (0: never)."""
        self.key = (job_id, attempt, rank)
        self.popen: subprocess.Popen | None = None
        self.start_time = 0.0
        self.killed = False
        self.result: tuple[int | None, float] | None = None  # (exit code, wall time of the end)
        # Its output, which the node's NodeLogs hands over (plinth.runtime.ray_logs).
        self.dir = worker_dir(actor_name(job_id, attempt, rank))
        shutil.rmtree(self.dir, ignore_errors=True)  # an earlier actor's of this name
        self.dir.mkdir(mode=0o700, parents=True)
        (self.dir / "id").write_text(uuid.uuid4().hex)  # tells it from a later one of its name
        self.log_file = self.dir / "output.log"
        self.log_path = ""
        self.checkpoint_dir: str | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._fence, args=(fence_after_s,), daemon=True,
                         name="plinth-fence").start()

    def _fence(self, after_s: float) -> None:
        """Self-fencing. A worker must not run on once it may have been replaced elsewhere:
        when this actor's raylet dies (Ray exits a raylet that the head declared dead, when it
        hears of it), or when the Ray head has been unreachable for `after_s` (a partition:
        the head declares the node dead after its health-check window, which must be longer,
        and the control plane starts the job again elsewhere). Then the worker's whole group
        is killed and this process ends; its shim, started with --parent, would die with it
        anyway."""
        import ray

        raylet = os.getppid()
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        lost_at: float | None = None
        while True:
            time.sleep(FENCE_POLL_S)
            if os.getppid() != raylet:
                break
            if not after_s:
                continue
            try:
                socket.create_connection((host, int(port)), timeout=FENCE_POLL_S).close()
                lost_at = None
            except OSError:
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at >= after_s:
                    break
        if self.popen is not None and self.result is None:
            killpg(self.popen.pid, signal.SIGKILL)
        os._exit(1)

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a port free on it now, for MASTER_ADDR and MASTER_PORT."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return host, int(s.getsockname()[1])

    def start(self, command: list[str], env: dict[str, str], workdir: str | None,
              log_path: str, memory_mib: int, run_as: str | None = None) -> tuple[int, float]:
        """Start the shim running `command` (as `run_as`, which needs a node running as root);
        (pid, start time). Raises if it cannot run. `log_path` is the control plane's log file
        for the job (kept for an adopter). The shim dies with this actor's process (--parent):
        an actor dies with its node, and a node that Ray declared dead has been replaced."""
        self.log_path = log_path
        self.checkpoint_dir = env.get("PLINTH_CHECKPOINT_DIR")
        full = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        full["PYTHONUNBUFFERED"] = "1"
        host = socket.gethostname()
        if run_as is not None:
            # As in the local runtime: the tenant's command and workdir are looked at only as
            # the tenant, by the shim's child.
            if os.geteuid() != 0:
                raise PlinthError(f"run_as: the Ray node on {host} runs as uid {os.geteuid()}, "
                                  f"so it cannot run a job as {run_as!r}")
            try:
                user_ids(run_as)
            except KeyError:
                raise PlinthError(f"run_as: no Unix user {run_as!r} on {host}") from None
            full.update(user_env(run_as))
        full.update(_interface_env(env.get(NODE_ADDRESS, ""), full))
        full.update(env)
        exe = command[0]
        found = os.access(Path(workdir or ".") / exe, os.X_OK) if "/" in exe else \
            shutil.which(exe, path=full.get("PATH", os.defpath)) is not None
        if run_as is None and not found:
            raise PlinthError(f"command[0]: {exe!r} is not an executable on {host}")
        if run_as is None and workdir and not Path(workdir).is_dir():
            raise PlinthError(f"workdir: {workdir!r} is not a directory on {host}")
        limits = ["--memory-mib", str(memory_mib)] if memory_mib else []
        # The shim's exit file is not read: the shim exits with the same code.
        self.popen = start_shim(str(self.dir / "exit"), command=command, env=full,
                                workdir=workdir, log_path=str(self.log_file),
                                opts=[*limits, "--log-limit", str(LOG_LIMIT_MIB * 2**20),
                                      "--parent", str(os.getpid())],
                                run_as=run_as,
                                shim_env={k: os.environ[k] for k in INHERITED_ENV
                                          if k in os.environ})
        self.start_time = psutil.Process(self.popen.pid).create_time()
        return self.popen.pid, self.start_time

    def info(self) -> dict:
        """Who this is (job, attempt, rank, pid, start time) and how it ended, if it has."""
        pid = self.popen.pid if self.popen else 0
        code, at = self.result if self.result else (None, None)
        return {"id": (*self.key, pid, self.start_time), "code": code, "ended_at": at,
                "log_path": self.log_path, "checkpoint_dir": self.checkpoint_dir}

    def wait(self) -> tuple[int | None, float]:
        """Block until the worker ends; (its exit code, or None if it vanished; when)."""
        with self.lock:
            if self.result is None:
                pid = self.popen.pid  # type: ignore[union-attr]
                # Not reaped yet, so its group id cannot be reused: sweep what it left running.
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                killpg(pid, signal.SIGKILL)
                rc = self.popen.wait()  # type: ignore[union-attr]
                # A shim killed by a signal we did not send left no exit code: lost.
                code = rc if rc >= 0 else (128 - rc if self.killed else None)
                self.result = (code, time.time())
            return self.result

    def signal(self, sig: int) -> None:
        """SIGTERM to the shim (it relays it to its group once), SIGKILL to the whole group."""
        if self.popen is None or self.result is not None:
            return
        if sig == signal.SIGKILL:
            self.killed = True
            killpg(self.popen.pid, sig)
        else:
            try:
                os.kill(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Kill what still runs of the worker and remove its output: the actor ends next."""
        if self.popen is not None and self.result is None:
            self.signal(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def actor_name(job_id: int, attempt: int, rank: int) -> str:
    return f"plinth-j{job_id}-a{attempt}-r{rank}"


def _interface_env(address: str, env: dict[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME naming the interface that holds this node's
    `address`, unless the job sets them: a node's hostname need not resolve to its address
    (Gloo then falls back to loopback, where the other nodes cannot reach it)."""
    iface = next((name for name, addrs in psutil.net_if_addrs().items()
                  if any(a.address == address for a in addrs)), None)
    if iface is None:
        return {}
    return {k: iface for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in env}

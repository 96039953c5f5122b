"""The real serving path: replica processes on this machine, the router, and the control loop.

`LocalServing` is the imperative shell around the same `Controller` and policies the simulator
uses. `tick(now)` reads the router's last window, asks the controller, and carries the decision
out: a scale-up starts replica processes, which join the router once they answer /healthz (their
cold start); a scale-down stops routing to a replica, lets its requests finish, then stops it.
`now` is passed in, so a test can drive the loop with a fake integer clock; `run` drives it with
the wall clock.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Self

import httpx
import numpy as np
import uvicorn

from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.serve.controller import Controller
from plinth.serve.policies import make_policy
from plinth.serve.router import Router
from plinth.serve.spec import ServiceSpec
from plinth.serve.types import Decision, Snapshot


@dataclass(slots=True)
class _Proc:
    rid: str
    job: str
    url: str
    proc: subprocess.Popen
    log: IO[bytes]
    registered: bool = False


class LocalServing:
    def __init__(self, spec: ServiceSpec, *, replica_env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.names = tuple(j.name for j in spec.jobs)
        self.router = Router(spec.router, list(self.names))
        self.controller = Controller(make_policy(spec.policy), len(self.names))
        self.procs: dict[str, list[_Proc]] = {j: [] for j in self.names}
        self.target = np.array([j.replicas for j in spec.jobs], np.int64)
        self.history: list[np.ndarray] = []  # arrivals per complete minute
        self._minute_counts = np.zeros(len(self.names), np.int64)
        self._minute = 0
        self._ids = itertools.count()
        self._env = dict(os.environ, OMP_NUM_THREADS="1", **(replica_env or {}))
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, *, wait_s: float = 120.0) -> None:
        """Start the router and the initial replicas; return once all replicas serve."""
        port = self.spec.router.port or free_port(self.spec.router.host)
        config = uvicorn.Config(self.router.app, host=self.spec.router.host, port=port,
                                log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        end = time.monotonic() + 30.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise PlinthError(f"router: could not listen on {self.spec.router.host}:{port}")
            time.sleep(0.02)
        # uvicorn runs the server with asyncio.run in our thread; its sockets know that loop.
        self._loop = self._server.servers[0].get_loop()
        self.port = port
        try:
            for job, n in zip(self.names, self.target, strict=True):
                for _ in range(int(n)):
                    self._launch(job)
            self.wait_ready(wait_s)
        except BaseException:
            self.stop()  # leave no replica process or router thread behind
            raise

    @property
    def url(self) -> str:
        return f"http://{self.spec.router.host}:{self.port}"

    def stop(self, grace_s: float = 5.0) -> None:
        for job in self.names:
            for p in list(self.procs[job]):
                self._retire(p, grace_s)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- replicas -----------------------------------------------------------------------------

    def _call(self, coro, timeout: float = 60.0):
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _launch(self, job: str) -> None:
        spec = next(j for j in self.spec.jobs if j.name == job)
        port = free_port()
        cmd = [sys.executable, "-m", "plinth.serve.replica", "--port", str(port),
               "--model", spec.model]
        # stderr goes to a file, not a pipe: a chatty replica must never block on a full pipe.
        log = tempfile.TemporaryFile()  # noqa: SIM115 -- closed when the replica is retired
        proc = subprocess.Popen(cmd, env=self._env, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        self.procs[job].append(_Proc(f"{job}-{next(self._ids)}", job, url, proc, log))

    def _retire(self, p: _Proc, grace_s: float) -> None:
        if p.registered:
            self._call(self.router.drain_replica(p.job, p.rid, grace_s), grace_s + 10)
        p.proc.terminate()
        try:
            p.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
        p.log.close()
        self.procs[p.job].remove(p)

    def poll_ready(self) -> int:
        """Register replicas that now answer /healthz; returns how many still start."""
        starting = 0
        for job in self.names:
            for p in self.procs[job]:
                if p.registered:
                    continue
                if p.proc.poll() is not None:
                    p.log.seek(0)
                    err = p.log.read().decode(errors="replace").strip().splitlines()
                    last = err[-1] if err else "no output"
                    raise PlinthError(f"replica {p.rid} exited with {p.proc.returncode}: {last}")
                try:
                    ok = httpx.get(p.url + "/healthz", timeout=0.5).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self._call(self.router.add_replica(job, p.rid, p.url))
                    p.registered = True
                else:
                    starting += 1
        return starting

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until every started replica serves (waits on real processes, not a clock)."""
        end = time.monotonic() + timeout_s
        while self.poll_ready():
            if time.monotonic() > end:
                raise PlinthError(f"replicas did not become ready in {timeout_s:g} s")
            time.sleep(0.05)

    def replica_counts(self) -> dict[str, int]:
        return {j: len(self.procs[j]) for j in self.names}

    # --- the control loop ---------------------------------------------------------------------

    def tick(self, now: float) -> Decision | None:
        """One control step at time `now` (seconds)."""
        self.poll_ready()
        windows = self._call(self.router.take_window())
        arrivals = np.array([windows[j].arrivals for j in self.names], np.int64)
        minute = int(now // 60)
        while self._minute < minute:  # close finished minutes
            self.history.append(self._minute_counts)
            self._minute_counts = np.zeros(len(self.names), np.int64)
            self._minute += 1
        self._minute_counts = self._minute_counts + arrivals
        jobs = self.spec.jobs
        hist = (np.stack(self.history, axis=1) if self.history
                else np.zeros((len(jobs), 0), np.int64))
        snap = Snapshot(
            now=now, jobs=self.names,
            slo_s=np.array([j.slo_ms / 1000 for j in jobs]),
            service_s=np.array([j.service_ms / 1000 for j in jobs]),
            quota=self.spec.quota, replicas=self.target.copy(),
            ready=np.array([windows[j].ready for j in self.names], np.int64),
            history=hist, window_s=self.spec.tick_s, window_arrivals=arrivals,
            window_p99_s=np.array([windows[j].p99_s for j in self.names]),
            ongoing=np.array([windows[j].ongoing for j in self.names], np.int64))
        decision = self.controller.step(snap)
        if decision is not None:
            self.apply(decision.replicas)
        return decision

    def apply(self, replicas: np.ndarray) -> None:
        for j, job in enumerate(self.names):
            want, have = int(replicas[j]), len(self.procs[job])
            for _ in range(want - have):
                self._launch(job)
            # Retire replicas still starting first, then the newest.
            victims = sorted(self.procs[job], key=lambda p: (p.registered, -int(p.rid.rsplit(
                "-", 1)[1])))[: max(have - want, 0)]
            for p in victims:
                self._retire(p, grace_s=self.spec.router.timeout_s)
        self.target = np.asarray(replicas, np.int64).copy()

    def run(self, duration_s: float | None = None, on_tick=None) -> None:
        """Tick every `tick_s` seconds of wall time until `duration_s` (or forever)."""
        t0 = time.monotonic()
        k = 0
        while duration_s is None or time.monotonic() - t0 < duration_s:
            k += 1
            time.sleep(max(0.0, t0 + k * self.spec.tick_s - time.monotonic()))
            d = self.tick(time.monotonic() - t0)
            if on_tick is not None:
                on_tick(self, d)

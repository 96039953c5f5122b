"""The control plane in virtual time, for tests: no processes, no sleeps.

    vp = VirtualPlatform(tmp_path)
    vp.behave("train", SimBehaviour(exit_at=30.0, exit_code=3))
    with vp.client() as c:
        j = c.submit({"name": "train", "command": ["true"]})
        vp.run_until(lambda: c.job(j)["state"] == "failed", limit_s=60)
    vp.close()

A `VirtualPlatform` is what `plinth up` builds (plinth.control.server.build) on a virtual clock:
a SQLite store in the test's folder, the admin's token, a `ControlPlane` with a policy, on the
simulated runtime (plinth.runtime.sim) over a cluster from a small cluster spec, and the FastAPI
app (plinth.control.api.create_app) behind fastapi's TestClient (`http`, with the admin token;
`client()` is the platform's Python client over it). Nothing runs: each job acts out its
`SimBehaviour` (chosen by the job's name, per attempt if the test says so; by default it exits 0
one second after its launch), at the reference speed, saving only when a stop asks it to.

Time moves only when the test says so. `advance(seconds)` and `run_until(predicate, limit_s)`
step the control plane at each instant something is due (a submission, a job's end, a timer),
and at least every `tick_s` (as the real loop's safety net), then jump the clock to the next
such instant. Nothing sleeps, and the same test gives the same times on any machine.

`restart(down_s)` is a control plane killed and started again on the same store: the simulated
processes run on while it is down, and the new one recovers and adopts them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Self

with warnings.catch_warnings():  # starlette would rather have httpx2; httpx is what we have
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

from plinth.client import Client
from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.service import ControlPlane
from plinth.control.store import Store
from plinth.core.clock import VirtualClock
from plinth.core.progress import WorkModel, unit_speed
from plinth.core.spec import load_cluster
from plinth.core.workload import Job
from plinth.runtime.sim import SimRuntime
from plinth.runtime.sim_behaviour import SimBehaviour
from plinth.sched.types import SchedConfig

EPOCH = 1_700_000_000.0  # the virtual clock starts here: times in the store look like dates
STEPS_AT_ONCE = 1000  # a control plane that asks for more steps at one instant is stuck
BASE_URL = "http://plinth.test"
ONE_SECOND = SimBehaviour(exit_at=1.0)  # what a job does unless the test says otherwise


class VirtualClient(Client):
    """The platform's Python client, over the TestClient instead of the network."""

    def __init__(self, http: TestClient, *, shared: bool = False) -> None:  # no server, no token
        self.server = BASE_URL
        self._http, self._shared = http, shared

    def close(self) -> None:  # the platform's own `http` outlives a client over it
        if not self._shared:
            super().close()


class _Jobs(Mapping[int, Job]):
    """The jobs the simulated runtime runs, as the control plane's owner holds them."""

    def __init__(self, platform: VirtualPlatform) -> None:
        self.platform = platform

    def __getitem__(self, job_id: int) -> Job:
        return self.platform.cp.owner.jobs[job_id].job

    def __iter__(self) -> Iterator[int]:
        return iter(self.platform.cp.owner.jobs)

    def __len__(self) -> int:
        return len(self.platform.cp.owner.jobs)


class VirtualPlatform:
    def __init__(self, tmp: Path, *, cluster: str = "1x4xA100", policy: str = "drf",
                 min_runtime_s: float = 0.0, round_s: float = 360.0, grace_s: float = 2.0,
                 tick_s: float = 1.0, default: SimBehaviour = ONE_SECOND) -> None:
        """`cluster`: a cluster spec (a shorthand such as 2x4xA100, or a YAML file); the other
        options are `plinth up`'s (--policy, --min-runtime, --round, --grace)."""
        self.home = tmp / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.clock = VirtualClock(EPOCH)
        self.cluster = load_cluster(cluster)
        self.policy, self.grace_s, self.tick_s, self.default = policy, grace_s, tick_s, default
        self.config = SchedConfig(min_runtime=min_runtime_s, round_s=round_s)
        self.behaviours: dict[tuple[str, int | None], SimBehaviour] = {}
        # At the reference speed, from where it stopped (no restore time), saving only when a
        # stop asks it to (a lease ending, a move): what a test's job does unless it says so.
        work = WorkModel(unit_speed, restore_overhead=0.0, checkpoint_interval=math.inf)
        self.runtime = SimRuntime(self.cluster, work, _Jobs(self), clock=self.clock,
                                  behaviour=self._behaviour, gang_grace_s=grace_s)
        self._start()

    # --- what jobs do -------------------------------------------------------------------------

    def behave(self, name: str, behaviour: SimBehaviour, *, attempt: int | None = None) -> None:
        """Jobs named `name` act out `behaviour` (only their attempt `attempt`, if given)."""
        self.behaviours[(name, attempt)] = behaviour

    def _behaviour(self, job: Job, attempt: int) -> SimBehaviour:
        found = self.behaviours.get((job.name, attempt)) or self.behaviours.get((job.name, None))
        return found or self.default

    # --- the API ------------------------------------------------------------------------------

    def client(self, token: str | None = None) -> VirtualClient:
        """The platform's Python client, with the admin's token unless another is given
        ("": none at all)."""
        if token is None:
            return VirtualClient(self.http, shared=True)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return VirtualClient(TestClient(self.app, base_url=BASE_URL, headers=headers))

    def job(self, job_id: int) -> dict:
        r = self.http.get(f"/v1/workloads/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def state(self, job_id: int) -> str:
        return self.job(job_id)["state"]

    # --- time ---------------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock()

    def step(self) -> None:
        """Every step of the control plane due at this instant (one may make another due)."""
        for _ in range(STEPS_AT_ONCE):
            due = self.cp.next_step_at()
            if due is None or due > self.clock():
                return
            self.cp.step()
        raise AssertionError(f"the control plane asked for {STEPS_AT_ONCE} steps at "
                             f"t={self.clock() - EPOCH:g} s")

    def advance(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass, stepping at every instant something is due."""
        self._run(lambda: False, seconds)

    def run_until(self, predicate: Callable[[], object], limit_s: float = 600.0) -> float:
        """Step until `predicate()` is true; return the virtual seconds that took. Fails after
        `limit_s` virtual seconds."""
        start = self.clock()
        if not self._run(predicate, limit_s):
            raise AssertionError(f"still not true after {limit_s:g} virtual seconds")
        return self.clock() - start

    def _run(self, predicate: Callable[[], object], limit_s: float) -> bool:
        end = self.clock() + limit_s
        while True:
            self.step()
            if predicate():
                return True
            if self.clock() >= end:
                return False
            due = self.cp.next_step_at()
            self.clock.to(min(math.inf if due is None else max(due, self.clock()),
                              self.clock() + self.tick_s, end))

    # --- life ---------------------------------------------------------------------------------

    def restart(self, down_s: float = 0.0) -> None:
        """Kill the control plane (nothing is shut down cleanly) and start it again on the same
        store after `down_s` seconds; the simulated processes run on meanwhile."""
        self._stop()
        self.runtime = self.runtime.restart()
        self.clock.to(self.clock() + down_s)
        self._start()

    def close(self) -> None:
        self._stop()
        self.runtime.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        """What `plinth up` does (plinth.control.server.build and serve), without a server."""
        self.store = Store(f"sqlite:///{self.home / 'plinth.db'}")
        self.auth = Auth(self.store)
        self.auth.bootstrap(self.home)
        self.token = (self.home / "token").read_text().strip()
        self.cp = ControlPlane(self.store, self.runtime, home=self.home, policy=self.policy,
                               config=self.config, grace_s=self.grace_s, clock=self.clock,
                               paced=False)
        self.cp.recover()
        self.app = create_app(self.cp, self.auth)
        self.http = TestClient(self.app, base_url=BASE_URL,
                               headers={"Authorization": f"Bearer {self.token}"})

    def _stop(self) -> None:
        self.http.close()
        self.cp.loop.stop()
        self.cp.writer.close()
        self.cp.workloads.close()

"""A Tune spec run through the control plane in this process, for the tests and benchmarks.

`LocalPlatform(home)` is what `plinth up` runs: a `ControlPlane` with its scheduler loop on a
`LocalRuntime`, its state in `home`, and its HTTP API on 127.0.0.1 (served on a thread), where
the units report (the addresses the tracker and servers listen on, what the clients tuned). A
Tune workload submitted to it is reconciled by `plinth.control.workloads` (the one loop), its
units placed by the scheduler and started by the runtime, as any workload's.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.service import ControlPlane
from plinth.control.store import Store
from plinth.runtime.local import LocalRuntime
from plinth.sched.types import SchedConfig
from plinth.tune.spec import TuneSpec

TENANT = "default"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a workload ended, its units' jobs (unit -> rows, oldest first), its wall time."""

    state: str
    units: dict[str, list[dict]]
    seconds: float

    def starts(self, unit: str) -> int:
        """How many times a unit was started: the attempts of every job it had (a job that
        never started has none)."""
        return sum(j["attempt"] for j in self.units.get(unit, []))


class LocalPlatform:
    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.store = Store(f"sqlite:///{(self.home / 'plinth.db').resolve()}")
        self.store.put_tenant(TENANT, None, None)
        holder: list[ControlPlane] = []
        runtime = LocalRuntime(self.home / "runtime", fake_gpus="1xA100",
                               notify=lambda: holder[0].notify() if holder else None)
        # min_runtime 0 and a short grace, as the platform tests run `plinth up`
        self.cp = ControlPlane(self.store, runtime, home=self.home,
                               config=SchedConfig(min_runtime=0.0), grace_s=2.0)
        holder.append(self.cp)
        # The API, bound before the control plane starts: units report to it at once.
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.cp.api_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._http = uvicorn.Server(uvicorn.Config(create_app(self.cp, Auth(self.store)),
                                                   log_level="warning", access_log=False,
                                                   lifespan="off"))
        self._served = threading.Thread(target=self._http.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)
        self._served.start()
        self.cp.start()

    def submit(self, spec: TuneSpec) -> int:
        return self.cp.workloads.submit(spec, TENANT).id

    def status(self, workload_id: int) -> dict:
        """What the workload's controller keeps (what its units reported)."""
        return self.workload(workload_id)["status"]

    def workload(self, workload_id: int) -> dict:
        (row,) = [r for r in self.store.workloads() if r["id"] == workload_id]
        return row

    def units(self, workload_id: int) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for job in self.store.units(workload_id):
            out.setdefault(job["unit"], []).append(job)
        return out

    def wait(self, workload_id: int, timeout_s: float) -> Outcome:
        """Until the workload has ended and none of its units' jobs still runs; on a timeout,
        cancel it and raise, with its units' states."""
        start = time.monotonic()
        while (state := self.workload(workload_id)["state"]) == "active" or any(
                j["end_time"] is None for js in self.units(workload_id).values() for j in js):
            if time.monotonic() - start > timeout_s:
                self.cp.workloads.cancel(workload_id)
                states = {u: js[-1]["state"] for u, js in self.units(workload_id).items()}
                raise TimeoutError(f"workload {workload_id} is {state} after {timeout_s:g} s; "
                                   f"units {states}; logs in {self.home / 'logs'}")
            time.sleep(0.5)  # another process's progress: nothing to wake us
        return Outcome(state, self.units(workload_id), time.monotonic() - start)

    def close(self) -> None:
        from plinth.cli.quickstart import kill_jobs

        self.cp.close()
        self._http.should_exit = True
        self._served.join(30)
        self._sock.close()
        kill_jobs(self.home)  # jobs outlive a control plane by design; a test's must not


def run_spec(spec: TuneSpec, db: Path, home: Path, timeout_s: float = 3600.0) -> Outcome:
    """Run `spec` with its database in `db` on a platform of its own in `home`."""
    platform = LocalPlatform(home)
    try:
        return platform.wait(platform.submit(spec.model_copy(update={"db": str(db)})),
                             timeout_s)
    finally:
        platform.close()

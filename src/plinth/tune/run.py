"""Drive a tuning task to its end with the Tune controller, through a caller's launcher.

`tune(spec, workdir, launch=...)` does what the control plane does for a Tune workload: it asks
`TuneController` for the units, starts each wanted one that is missing or has ended with
`launch(unit)`, stops each unwanted live one, and tells the controller which units ended, until
the controller says the task is finished. It starts no process itself: in production the
control plane and `plinth.runtime` do; tests and benchmarks pass a launcher (a
`subprocess.Popen` per unit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from plinth.control.kinds import Observed, Unit, Workload, reconcile
from plinth.sched.lifecycle import State
from plinth.tune.controller import TuneController
from plinth.tune.spec import TuneSpec


class Proc(Protocol):
    """What a launcher returns: `subprocess.Popen` is one."""

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the task ended, how many jobs each unit took, and its wall time."""

    state: State
    starts: dict[str, int]
    seconds: float


def tune(spec: TuneSpec, workdir: str | Path, *, launch: Callable[[Unit], Proc],
         timeout_s: float = 3600.0, tick_s: float = 0.25) -> Outcome:
    """Run `spec` with its database in `workdir`; returns when the controller says it is done."""
    spec = spec.model_copy(update={"db": str(workdir)})
    w = Workload(1, "Tune", spec.name, spec.tenant or "local", spec)
    ctl = TuneController()
    procs: dict[str, Proc] = {}
    observed: dict[str, Observed] = {}
    starts: dict[str, int] = {}
    jobs = 0
    start = time.monotonic()
    try:
        while (state := ctl.finished(w, observed)) is None:
            now = time.monotonic()
            if now - start > timeout_s:
                raise TimeoutError(f"tuning task {spec.name} did not end in {timeout_s:g} s")
            add, drop = reconcile(ctl.units(w, observed, now), observed)
            by_id = {o.job_id: o.name for o in observed.values()}
            for job_id in drop:
                name = by_id[job_id]
                procs[name].terminate()
                observed[name] = Observed(name, job_id, State.CANCELLED)
            for unit in add:
                jobs += 1
                procs[unit.name] = launch(unit)
                starts[unit.name] = starts.get(unit.name, 0) + 1
                observed[unit.name] = Observed(unit.name, jobs, State.RUNNING)
            for name, proc in procs.items():
                code = proc.poll()
                if code is not None and not observed[name].state.terminal:
                    ended = State.SUCCEEDED if code == 0 else State.FAILED
                    observed[name] = Observed(name, observed[name].job_id, ended)
                    ctl.unit_ended(w, name)
            time.sleep(tick_s)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
    return Outcome(state, starts, time.monotonic() - start)

"""Workload kinds and their controllers: how much of each workload should run.

A workload is what a user submits: a spec of some `kind`. Its kind's controller turns it into
the runtime units it needs and decides how many there are. The scheduler then places every
unit as a job, and only `plinth.runtime` starts processes. Controllers decide *how much*; the
owner (`plinth.sched.owner`) decides *where and when*.

    controller.units(spec, observed, now) -> list[Unit]

It is a pure function of the workload's spec, the units of it that exist now (by name, with
their state), and the time. The control plane reconciles what it returns with what exists
(`reconcile`): it submits each wanted unit that does not exist yet, and cancels each unit that
is no longer wanted. The kinds map onto this as follows:

- `Job`: one unit, the job's gang, wanted once and never resized (a finished job is not
  started again).
- `Service` (the next issue): a replica set whose size the autoscaler picks. Its units are
  `replica-0..N-1`; scaling down drops the highest names.
- `FLTask`: a tree of aggregators. A leaf aggregator sets `colocate_with` to name the unit it
  must share a node with.
- `Tune`: a set of fractional-GPU tuning servers.

Until the scheduler places by `colocate_with`, `reconcile` refuses a unit that asks for it, in
one line, rather than placing it anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from plinth.control.spec import JobSpec
from plinth.core.errors import SpecError
from plinth.core.registry import Registry
from plinth.sched.lifecycle import State


@dataclass(frozen=True, slots=True)
class Unit:
    """One schedulable piece of a workload; the scheduler sees it as one job (one gang)."""

    name: str  # unique within its workload: "job", "replica-3", "leaf-1"
    spec: JobSpec  # what it runs and what it asks for
    colocate_with: str | None = None  # the unit of the same workload whose node it must share


@dataclass(frozen=True, slots=True)
class Observed:
    """A unit as it exists now."""

    name: str
    job_id: int
    state: State


class Controller(Protocol):
    kind: str

    def units(self, spec: object, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        """The units the workload should have now."""
        ...


class JobController:
    """A Job is its one gang, submitted once."""

    kind = "Job"

    def units(self, spec: object, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        if not isinstance(spec, JobSpec):
            raise SpecError(f"kind Job: expected a Job spec, got {type(spec).__name__}")
        if observed:  # it exists, or existed: a finished job is not run again
            return [Unit(name, spec) for name in observed]
        return [Unit("job", spec)]


CONTROLLERS: Registry[type] = Registry("workload kind")
CONTROLLERS.add("Job", JobController)


def controller_for(spec: object) -> Controller:
    """The controller of a spec's kind; a kind the control plane does not run yet is a
    one-line error naming the command that runs it."""
    kind = getattr(spec, "kind", "Job")
    if kind not in CONTROLLERS.names():
        run_with = getattr(spec, "run_with", "its own command")
        raise SpecError(f"kind: the control plane does not run {kind} specs yet; use "
                        f"`{run_with}` meanwhile")
    return CONTROLLERS.make(kind)


def reconcile(wanted: Iterable[Unit], observed: Mapping[str, Observed]
              ) -> tuple[list[Unit], list[int]]:
    """What to submit (wanted, not there) and which jobs to cancel (there, not wanted and not
    finished), in a stable order."""
    wanted = list(wanted)
    names = [u.name for u in wanted]
    if len(names) != len(set(names)):
        raise SpecError(f"units: names must be unique within a workload, got {names}")
    for u in wanted:
        if u.colocate_with is not None:
            raise SpecError(f"units[{u.name}].colocate_with: placement on the node of "
                            f"{u.colocate_with!r} is not supported by the scheduler yet")
    add = [u for u in wanted if u.name not in observed]
    keep = set(names)
    drop = [o.job_id for name, o in sorted(observed.items())
            if name not in keep and not o.state.terminal]
    return add, drop

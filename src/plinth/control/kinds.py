"""Workload kinds and their controllers: how much of each workload should run.

A workload is what a user submits: a spec of some `kind`. Its kind's controller turns it into
the runtime units it needs and decides how many there are. The scheduler then places every
unit as a job, and only `plinth.runtime` starts processes. Controllers decide *how much*; the
owner (`plinth.sched.owner`) decides *where and when*.

    controller.units(workload, observed, now) -> list[Unit]

It is a function of the workload (its spec and the status its controller keeps), the units of
it that exist now (by name, with their job's state), and the time. The control plane
(`plinth.control.workloads`) reconciles what it returns with what exists (`reconcile`): it
submits each wanted unit that does not exist or has ended (a replacement), and cancels each
live unit that is no longer wanted. The kinds map onto this as follows:

- `Job`: one unit, the job's gang, run once. A Job is submitted as that job directly (the
  submit path is hot) and has no controller or workload record.
- `Service`: a replica set whose size the autoscaler picks (`plinth.serve.workload`). Its units
  are `replica-0..N-1`; scaling down drops the highest names; a replica that dies is replaced.
- `FLTask`: its server (`plinth.fl.workload`), resumed from its last round when replaced; then
  a tree of aggregators, where a leaf sets `colocate_with` to name the unit whose node it must
  share.
- `Tune`: an RPC tracker, tuning servers on GPU (or CPU) shares, and the clients that search
  and build, sharded by task (`plinth.tune.controller`).

A unit that names `colocate_with` is submitted once its partner is placed, pinned to the
partner's node (the job's `nodelist`, which the scheduler honours as Slurm's `--nodelist`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    node: str | None = None  # where its job runs, once it is placed


@dataclass(slots=True)
class Workload:
    """A submitted workload as its controller sees it. `status` is the controller's own record
    (desired size, why, addresses), stored with the workload and shown by `plinth show`;
    `secret` is shared by its units (from the OS CSPRNG), e.g. for replicas to join a router."""

    id: int
    kind: str
    name: str
    tenant: str
    spec: Any
    status: dict[str, Any] = field(default_factory=dict)
    secret: str = ""


class Controller(Protocol):
    kind: str

    def units(self, w: Workload, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        """The units the workload should have now."""
        ...


CONTROLLERS: Registry[type] = Registry("workload kind")
CONTROLLERS.add("Service", "plinth.serve.workload:ServiceController")
CONTROLLERS.add("FLTask", "plinth.fl.workload:FLTaskController")
CONTROLLERS.add("Tune", "plinth.tune.controller:TuneController")


def check_kind(spec: object) -> str:
    """The kind of a spec the control plane runs; a kind it does not run yet is a one-line
    error naming the command that runs it."""
    kind = getattr(spec, "kind", "Job")
    if kind != "Job" and kind not in CONTROLLERS.names():
        run_with = getattr(spec, "run_with", "its own command")
        raise SpecError(f"kind: the control plane does not run {kind} specs yet; use "
                        f"`{run_with}` meanwhile")
    return kind


def reconcile(wanted: Iterable[Unit], observed: Mapping[str, Observed]
              ) -> tuple[list[Unit], list[int]]:
    """What to submit (wanted, and not there or ended: a replacement) and which jobs to cancel
    (live, not wanted), in a stable order.

    A unit that names `colocate_with` is submitted pinned to the node its partner runs on
    (`nodelist`), once the partner is placed; until then it waits. A live one that is not on
    its partner's node (the partner was replaced elsewhere) is cancelled, to be replaced."""
    wanted = list(wanted)
    names = [u.name for u in wanted]
    if len(names) != len(set(names)):
        raise SpecError(f"units: names must be unique within a workload, got {names}")
    keep = set(names)
    add, drop = [], []
    for u in wanted:
        o = observed.get(u.name)
        if u.colocate_with is None:
            if o is None or o.state.terminal:
                add.append(u)
            continue
        if u.colocate_with not in keep or u.colocate_with == u.name:
            raise SpecError(f"units[{u.name}].colocate_with: {u.colocate_with!r} is not "
                            f"another unit of the workload")
        partner = observed.get(u.colocate_with)
        node = partner.node if partner is not None and not partner.state.terminal else None
        if o is not None and not o.state.terminal:
            if node is not None and o.node is not None and o.node != node:
                drop.append(o.job_id)
        elif node is not None:
            add.append(Unit(u.name, u.spec.model_copy(update={"nodelist": [node]}),
                            u.colocate_with))
    drop += [o.job_id for name, o in sorted(observed.items())
             if name not in keep and not o.state.terminal]
    return add, drop

"""Workload kinds: what a kind's controller sees, decides and may do.

A workload is what a user submits: a spec of some `kind`. Its kind's controller turns it into
the runtime units it needs and decides how many there are. The scheduler then places every
unit as a job, and only `plinth.runtime` starts processes. Controllers decide *how much*; the
owner (`plinth.sched.owner`) decides *where and when*. A controller depends on `core` only: it
sees its workloads, their units (`Observed`) and what the units report (`Report`), and acts
through the narrow `Context` the control plane (or a test) hands it, never the control plane.

    controller.units(workload, observed, now) -> list[Unit]

is a function of the workload (its spec and the status its controller keeps), the units of it
that exist now (by name, with their job's state), and the time. The control plane
(`plinth.control.workloads`) reconciles what it returns with what exists (`reconcile`): it
submits each wanted unit that does not exist or has ended (a replacement), and cancels each
live unit that is no longer wanted. The kinds map onto this as follows:

- `Job`: one unit, the job's gang, run once. A Job is submitted as that job directly (the
  submit path is hot) and has no controller or workload record.
- `Service`: a router and a replica set whose size the autoscaler picks
  (`plinth.serve.workload`). Its units are `router` and, once the router has reported its
  address, `replica-0..N-1`; scaling down drops the highest names; a unit that dies is replaced.
- `FLTask`: its server (`plinth.fl.workload`), resumed from its last round when replaced; then
  a tree of aggregators, where a leaf sets `colocate_with` to name the unit whose node it must
  share, and a node's middle aggregator sets `apart_from` to name those whose nodes it must not.
- `Tune`: an RPC tracker, tuning servers on GPU (or CPU) shares, and the clients that search
  and build, sharded by task (`plinth.tune.controller`).

The life of a workload, as its controller sees it (every call from the control loop, under its
lock, so a controller needs no lock of its own):

1. `check(w, ctx)` before anything is stored: raise `SpecError` if it can never run here
   (`ctx.fits` checks a unit that `units` will list only later).
2. `start(w, ctx)` once it is accepted, and again for each active workload after a restart
   (`ctx.recovered` says which): set up what lives beside the units (handouts).
3. `units(w, observed, now)`, whenever one of its units changed, after a report or a tick that
   changed it, and once a second as a safety net.
4. `report(w, unit, body, ctx)` when a unit reports (over the API, with a credential scoped to
   that unit's current job: `report_model(w, unit)` is the pydantic model its body is checked
   with, and None refuses reports from that unit).
5. `unit_ended(w, unit, ctx)` once per ended job of a unit, across restarts.
6. `tick(ws, ctx)` every loop turn, with every active workload of the kind at once (the
   autoscaler plans for all services together): the ones whose status it changed.
7. `finished(w, observed)`: the workload's end state (`WorkloadState`) once it is over, else
   None.
8. `end(w, ctx)` when it is over or cancelled: release what `start` set up. `close()` at
   shutdown.

`BaseController` gives each of these a do-nothing default, so a kind writes only what it needs.
A unit that names `colocate_with` is submitted once its partner is placed, pinned to the
partner's node (the job's `nodelist`, which the scheduler honours as Slurm's `--nodelist`). A
unit that names `apart_from` (Kubernetes' pod anti-affinity) is submitted with a `nodelist` of
every node that none of those units is placed on, one at a time in the order the controller
lists them, so that two of them never race onto one node.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec
from plinth.core.lifecycle import IllegalTransition, State


class WorkloadState(enum.Enum):
    """A workload's state, as a job has one: active until its controller says it is over
    (`finished`) or it is cancelled; then for good."""

    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self is not WorkloadState.ACTIVE


WORKLOAD_TRANSITIONS: dict[WorkloadState, frozenset[WorkloadState]] = {
    WorkloadState.ACTIVE: frozenset({WorkloadState.SUCCEEDED, WorkloadState.FAILED,
                                     WorkloadState.CANCELLED}),
    WorkloadState.SUCCEEDED: frozenset(),
    WorkloadState.FAILED: frozenset(),
    WorkloadState.CANCELLED: frozenset(),
}


def check_workload_transition(workload_id: int, old: WorkloadState,
                              new: WorkloadState) -> None:
    if new not in WORKLOAD_TRANSITIONS[old]:
        raise IllegalTransition(f"workload {workload_id}: cannot go from {old.value} to "
                                f"{new.value}")


@dataclass(frozen=True, slots=True)
class Unit:
    """One schedulable piece of a workload; the scheduler sees it as one job (one gang)."""

    name: str  # unique within its workload: "job", "replica-3", "leaf-1"
    spec: JobSpec  # what it runs and what it asks for
    colocate_with: str | None = None  # the unit of the same workload whose node it must share
    apart_from: tuple[str, ...] = ()  # units of the same workload whose nodes it must not share


@dataclass(frozen=True, slots=True)
class Observed:
    """A unit as it exists now."""

    name: str
    job_id: int
    state: State
    node: str | None = None  # where its job runs, once it is placed
    attempt: int = 0  # its job's attempt: 1 once it first runs, one more each time it restarts


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


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the cluster has, for `check`: a workload that needs more can never run."""

    cpus: float
    gpus: int
    nodes: int


class Files(Protocol):
    """A folder of the control plane's own where a controller hands its units files (an FL
    task's app and tokens): the units' tenant can read them and cannot write or swap them."""

    dir: Path

    def write(self, name: str, text: str) -> Path:
        """Write `name` (may name a subfolder) atomically; its path."""
        ...

    def read(self, name: str) -> str | None:
        """What `write` wrote there, or None."""
        ...


class Context(Protocol):
    """What the control plane lends a controller: no more than this."""

    recovered: bool  # in `start`: the workload was active before a restart

    def now(self) -> float:
        """The control plane's clock (virtual in the simulator and in tests)."""
        ...

    def capacity(self) -> Capacity:
        ...

    def fits(self, spec: JobSpec) -> None:
        """Raise (one line naming why) if a job of `spec` could never run on this cluster: for
        a unit a controller starts only later, checked in `check`."""
        ...

    def files(self, w: Workload) -> Files:
        """The workload's handout folder (made on first use)."""
        ...

    def state_dir(self, w: Workload) -> Path:
        """Where the workload's units keep their state (checkpoints, results), in its tenant's
        own folder; the units make it, as the tenant. A controller passes it to its units and
        never reads from it: what it needs to know, units report."""
        ...

    def count(self, metric: str, subject: str, **values: float) -> None:
        """Record values of one of the platform's metrics about `subject` (a workload's name):
        `metric` names a method of `plinth.control.metrics.Metrics`."""
        ...


class Controller(Protocol):
    """A kind's controller: one object serves every workload of its kind."""

    kind: ClassVar[str]

    def check(self, w: Workload, ctx: Context) -> None: ...
    def start(self, w: Workload, ctx: Context) -> None: ...
    def units(self, w: Workload, observed: Mapping[str, Observed], now: float
              ) -> list[Unit]: ...
    def report_model(self, w: Workload, unit: str) -> type[BaseModel] | None: ...
    def report(self, w: Workload, unit: str, body: BaseModel, ctx: Context) -> bool: ...
    def unit_ended(self, w: Workload, unit: str, ctx: Context) -> None: ...
    def tick(self, ws: list[Workload], ctx: Context) -> list[Workload]: ...
    def finished(self, w: Workload, observed: Mapping[str, Observed]
                 ) -> WorkloadState | None: ...
    def end(self, w: Workload, ctx: Context) -> None: ...
    def close(self) -> None: ...


class BaseController:
    """Do-nothing defaults for every step of the contract but `units`."""

    kind: ClassVar[str] = ""

    def check(self, w: Workload, ctx: Context) -> None:
        pass

    def start(self, w: Workload, ctx: Context) -> None:
        pass

    def units(self, w: Workload, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        raise NotImplementedError

    def report_model(self, w: Workload, unit: str) -> type[BaseModel] | None:
        return None  # no unit of this kind reports

    def report(self, w: Workload, unit: str, body: BaseModel, ctx: Context) -> bool:
        return False

    def unit_ended(self, w: Workload, unit: str, ctx: Context) -> None:
        pass

    def tick(self, ws: list[Workload], ctx: Context) -> list[Workload]:
        return []

    def finished(self, w: Workload, observed: Mapping[str, Observed]) -> WorkloadState | None:
        return None

    def end(self, w: Workload, ctx: Context) -> None:
        pass

    def close(self) -> None:
        pass


def reconcile(wanted: Iterable[Unit], observed: Mapping[str, Observed],
              nodes: Sequence[str] = ()) -> tuple[list[Unit], list[int]]:
    """What to submit (wanted, and not there or ended: a replacement) and which jobs to cancel
    (live, not wanted), in a stable order.

    A unit that names `colocate_with` is submitted pinned to the node its partner runs on
    (`nodelist`), once the partner is placed; until then it waits. A live one that is not on
    its partner's node (the partner was replaced elsewhere) is cancelled, to be replaced.

    A unit that names `apart_from` is submitted with the `nodes` (the cluster's) that none of
    those units is placed on, once each of them that is live is placed and each listed before
    it that is wanted is live; until then, or while no node is left, it waits."""
    wanted = list(wanted)
    names = [u.name for u in wanted]
    if len(names) != len(set(names)):
        raise SpecError(f"units: names must be unique within a workload, got {names}")
    keep = set(names)
    order = {name: i for i, name in enumerate(names)}
    add, drop = [], []

    def live(name: str) -> Observed | None:
        o = observed.get(name)
        return o if o is not None and not o.state.terminal else None

    for u in wanted:
        o = live(u.name)
        for other in (u.colocate_with, *u.apart_from):
            if other is not None and (other not in keep or other == u.name):
                field = "colocate_with" if other == u.colocate_with else "apart_from"
                raise SpecError(f"units[{u.name}].{field}: {other!r} is not another unit of "
                                f"the workload")
        if u.colocate_with is not None:
            partner = live(u.colocate_with)
            node = partner.node if partner is not None else None
            if o is not None:
                if node is not None and o.node is not None and o.node != node:
                    drop.append(o.job_id)
            elif node is not None:
                add.append(replace(u, spec=u.spec.model_copy(update={"nodelist": [node]})))
        elif o is None and u.apart_from:
            others = [live(name) for name in u.apart_from]
            if any(x is not None and x.node is None for x in others) or any(
                    x is None and order[name] < order[u.name]
                    for name, x in zip(u.apart_from, others)):
                continue  # one of them is being placed, or goes first
            taken = {x.node for x in others if x is not None}
            free = [n for n in nodes if n not in taken]
            if free:
                add.append(replace(u, spec=u.spec.model_copy(update={"nodelist": free})))
        elif o is None:
            add.append(u)
    drop += [o.job_id for name, o in sorted(observed.items())
             if name not in keep and not o.state.terminal]
    return add, drop


class FolderFiles:
    """`Files` in a plain folder (made on first write), for a `LocalContext`."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder

    def write(self, name: str, text: str) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        return path

    def read(self, name: str) -> str | None:
        try:
            return (self.dir / name).read_text()
        except FileNotFoundError:
            return None


@dataclass(slots=True)
class LocalContext:
    """A `Context` over one folder, a fixed capacity and a clock you set: to run a controller
    outside the control plane (the contract tests, a notebook). Metrics it records are kept in
    `counted`."""

    folder: Path
    cap: Capacity = Capacity(cpus=64.0, gpus=8, nodes=4)
    t: float = 0.0
    recovered: bool = False
    counted: list[tuple[str, str, dict[str, float]]] = field(default_factory=list)

    def now(self) -> float:
        return self.t

    def capacity(self) -> Capacity:
        return self.cap

    def fits(self, spec: JobSpec) -> None:
        if spec.resources.cpus > self.cap.cpus or spec.resources.gpus > self.cap.gpus:
            raise SpecError(f"resources: {spec.name!r} asks for more than the capacity "
                            f"({self.cap.cpus:g} CPUs, {self.cap.gpus} GPUs)")

    def files(self, w: Workload) -> FolderFiles:
        return FolderFiles(self.folder / "files" / f"workload-{w.id}")

    def state_dir(self, w: Workload) -> Path:
        return self.folder / "state" / f"workload-{w.id}"

    def count(self, metric: str, subject: str, **values: float) -> None:
        self.counted.append((metric, subject, values))

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
  share, and a node's middle aggregator sets `apart_from` to name those whose nodes it must not.
- `Tune`: an RPC tracker, tuning servers on GPU (or CPU) shares, and the clients that search
  and build, sharded by task (`plinth.tune.controller`).

A unit that names `colocate_with` is submitted once its partner is placed, pinned to the
partner's node (the job's `nodelist`, which the scheduler honours as Slurm's `--nodelist`). A
unit that names `apart_from` (Kubernetes' pod anti-affinity) is submitted with a `nodelist` of
every node that none of those units is placed on, one at a time in the order the controller
lists them, so that two of them never race onto one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from plinth.core.jobspec import JobSpec
from plinth.core.errors import SpecError
from plinth.core.registry import Registry
from plinth.core.lifecycle import State


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

"""Workloads of several units (a Service, and the kinds after it) in the control plane.

A workload is stored once (`workloads` table) with its spec, its controller's status and a
secret for its units; its units are ordinary jobs that point back to it (`workload_id`,
`unit`), so the scheduler places them, the runtime runs them and recovery re-adopts them as any
job. This module drives each kind's controller through its contract (`plinth.core.kinds`) and
keeps each active workload's units in line with what its controller wants (`reconcile`): on
submit, whenever one of its units ends or reports, after the controller changes its mind
(`tick`), and once a second as a safety net. A controller sees the control plane only through
`PlaneContext`.

One controller object per kind serves every workload of that kind, so that it can decide for
all of them together (the autoscaler plans for every service at once).
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from plinth.control import unitauth
from plinth.control.errors import NotFound
from plinth.control.kinds import CONTROLLERS
from plinth.control.tenantfs import Handout
from plinth.core.errors import PlinthError, SpecError
from plinth.core.jobspec import JobSpec
from plinth.core.kinds import (
    BaseController,
    Capacity,
    Observed,
    Workload,
    WorkloadState,
    check_workload_transition,
    reconcile,
)
from plinth.core.lifecycle import State
from plinth.core.spec import errors_message, spec_from_dict

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane

log = logging.getLogger("plinth.control")
RECONCILE_EVERY_S = 1.0
TOLD = "units_told"  # status key: unit -> the id of its last ended job the controller was told of


class Fenced(PlinthError):
    """A report from a job that is no longer its unit's current attempt (or not a unit)."""


class PlaneContext:
    """The control plane as a kind's controller sees it (`plinth.core.kinds.Context`)."""

    def __init__(self, cp: ControlPlane, recovered: bool = False) -> None:
        self.cp, self.recovered = cp, recovered

    def now(self) -> float:
        return self.cp.clock()

    def capacity(self) -> Capacity:
        nodes = self.cp.cluster.nodes
        return Capacity(sum(n.cpus_milli for n in nodes) / 1000, self.cp.cluster.total_gpus,
                        len(nodes))

    def fits(self, spec: JobSpec) -> None:
        self.cp.admit(spec, spec.tenant or "default")

    def files(self, w: Workload) -> Handout:
        return self.cp.workload_files(w.id, w.tenant)

    def state_dir(self, w: Workload) -> Path:
        return self.cp.workload_dir(w.id, w.tenant)

    def count(self, metric: str, subject: str, **values: float) -> None:
        getattr(self.cp.metrics, metric)(subject, **values)


class Workloads:
    def __init__(self, cp: ControlPlane, options: dict[str, dict[str, Any]] | None = None
                 ) -> None:
        """`options`: per kind, what its controller is built with (`plinth up` flags)."""
        self.cp = cp
        self.options = options or {}
        self.controllers: dict[str, BaseController] = {}
        self.ctx = PlaneContext(cp)
        self.active: dict[int, Workload] = {}
        self.unit_jobs: dict[int, dict[str, int]] = {}  # workload -> unit -> its latest job
        self.job_unit: dict[int, tuple[int, str]] = {}  # job -> (workload, unit)
        self.ended_jobs: dict[int, State] = {}  # unit jobs that have ended, and how
        self._dirty: set[int] = set()
        self._next = 0.0

    def controller(self, kind: str) -> BaseController:
        if kind not in self.controllers:
            self.controllers[kind] = CONTROLLERS.make(kind, **self.options.get(kind, {}))
        return self.controllers[kind]

    def close(self) -> None:
        for c in self.controllers.values():
            c.close()

    # --- submit, cancel, find --------------------------------------------------------------

    def submit(self, spec: Any, tenant: str) -> Workload:
        """Accept a workload: store it and submit its first units. A workload whose units can
        never run here is refused, and nothing is stored."""
        ctl = self.controller(spec.kind)
        with self.cp._lock:
            if any(w.name == spec.name and w.tenant == tenant for w in self.active.values()):
                raise SpecError(f"name: tenant {tenant!r} already has an active workload "
                                f"named {spec.name!r}")
            spec = spec.model_copy(update={"tenant": tenant})
            w = Workload(0, spec.kind, spec.name, tenant, spec, {}, secrets.token_urlsafe(24))
            ctl.check(w, self.ctx)
            w.id = self.cp.store.insert_workload(
                {"kind": w.kind, "name": w.name, "tenant": tenant,
                 "spec": spec.model_dump(mode="json"), "status": {}, "secret": w.secret},
                self.cp.clock())
            try:
                self._start(w)
                for u in ctl.units(w, {}, self.cp.clock()):  # each must be able to run here
                    self.cp.admit(u.spec, tenant)
            except BaseException:  # refused: nothing of it stays
                self.active.pop(w.id, None)
                ctl.end(w, self.ctx)
                self.cp.store.delete_workload(w.id)
                raise
            self.reconcile(w, self.cp.clock())
            return w

    def _start(self, w: Workload, recovered: bool = False) -> None:
        self.active[w.id] = w
        self.unit_jobs.setdefault(w.id, {})
        self.controller(w.kind).start(w, PlaneContext(self.cp, recovered))
        self.cp.store.update_workload(w.id, status=w.status)

    def find(self, ref: str, tenant: str | None) -> dict:
        """A workload's row by name (the newest of that name) or id; `tenant` None: any."""
        rows = self.cp.store.workloads(tenant=tenant, name=None if ref.isdigit() else ref)
        if ref.isdigit():
            rows = [r for r in rows if r["id"] == int(ref)]
        if not rows:
            raise NotFound(f"workload {ref!r} not found")
        return rows[0]

    def cancel(self, workload_id: int) -> str:
        with self.cp._lock:
            w = self.active.get(workload_id)
            if w is None:
                return "ended"
            self._end(w, WorkloadState.CANCELLED)
            for job_id in self.unit_jobs.get(w.id, {}).values():
                if job_id not in self.ended_jobs:
                    try:
                        self.cp.cancel(job_id)
                    except PlinthError:  # it ended meanwhile
                        pass
            return "cancelled"

    def _end(self, w: Workload, state: WorkloadState) -> None:
        check_workload_transition(w.id, WorkloadState.ACTIVE, state)
        self.active.pop(w.id, None)
        self.controller(w.kind).end(w, self.ctx)
        self.cp.store.update_workload(w.id, state=state.value, end_time=self.cp.clock(),
                                      status=w.status)

    # --- the loop ---------------------------------------------------------------------------

    def job_ended(self, job_id: int, state: State) -> None:
        """A job has ended (called for every job; only units matter here)."""
        found = self.job_unit.get(job_id)
        if found is not None:
            self.ended_jobs[job_id] = state
            self._dirty.add(found[0])

    def tick(self, now: float) -> None:
        """From the control loop, under its lock: controllers decide, units follow."""
        if not self.active:
            return
        by_kind: dict[str, list[Workload]] = {}
        for w in self.active.values():
            by_kind.setdefault(w.kind, []).append(w)
        for kind, ws in by_kind.items():
            for w in self.controller(kind).tick(ws, self.ctx):
                self.cp.store.update_workload(w.id, status=w.status)
                self._dirty.add(w.id)
            for w in ws:  # /metrics: plinth_service_replicas{service, kind}
                if "desired" in w.status:
                    self.ctx.count("service_replicas", w.name, desired=w.status["desired"],
                                   ready=w.status.get("ready", 0))
        if now >= self._next:
            self._next = now + RECONCILE_EVERY_S
            self._dirty.update(self.active)
        for wid in sorted(self._dirty):
            w = self.active.get(wid)
            if w is not None:
                try:
                    self.reconcile(w, now)
                except Exception:
                    log.exception("workload %d (%s): reconcile failed", w.id, w.name)
        self._dirty.clear()

    def observed(self, w: Workload) -> dict[str, Observed]:
        out = {}
        for unit, job_id in self.unit_jobs.get(w.id, {}).items():
            state, node, attempt = self.ended_jobs.get(job_id), None, 0
            if state is None:
                js = self.cp.owner.jobs.get(job_id)
                state = js.status if js is not None else State.PENDING  # held, or incoming
                if js is not None and js.allocation is not None and js.allocation.slots:
                    node = self.cp.cluster.nodes[js.allocation.slots[0].node].name
                attempt = js.attempt if js is not None else 0
            out[unit] = Observed(unit, job_id, state, node, attempt)
        return out

    def reconcile(self, w: Workload, now: float) -> None:
        ctl = self.controller(w.kind)
        observed = self.observed(w)
        # Tell the controller once per ended job, across restarts: the last job told of, per
        # unit, is kept in the workload's status and stored with what the controller changed.
        told = w.status.setdefault(TOLD, {})
        ended = [u for u, o in observed.items() if o.state.terminal and
                 o.job_id in self.ended_jobs and told.get(u) != o.job_id]
        for unit in ended:
            told[unit] = observed[unit].job_id
            ctl.unit_ended(w, unit, self.ctx)
        if ended:
            self.cp.store.update_workload(w.id, status=w.status)
        down = self.cp.owner.down.nodes  # a node that has left is no place for a unit
        nodes = [n.name for i, n in enumerate(self.cp.cluster.nodes) if i not in down]
        add, drop = reconcile(ctl.units(w, observed, now), observed, nodes)
        for job_id in drop:
            try:
                self.cp.cancel(job_id)
            except PlinthError:
                pass
        for u in add:
            spec, row, at = self.cp.admit(u.spec, w.tenant)
            row = {**row, "workload_id": w.id, "unit": u.name}
            job_id = self.cp.store.insert_job(row, at, f"unit {u.name} of {w.kind} {w.name}")
            old = self.unit_jobs[w.id].get(u.name)
            if old is not None:
                self.job_unit.pop(old, None)
                self.ended_jobs.pop(old, None)
            self.unit_jobs[w.id][u.name] = job_id
            self.job_unit[job_id] = (w.id, u.name)
            self.cp.accepted(job_id, spec, at)
        state = ctl.finished(w, self.observed(w))
        if state is not None:
            self._end(w, state)

    # --- after a restart --------------------------------------------------------------------

    def recover(self) -> None:
        """Find the active workloads again, with their units' latest jobs (the jobs themselves
        are recovered as every job is)."""
        for row in reversed(self.cp.store.workloads(active=True)):
            try:
                spec = spec_from_dict(row["spec"], source=f"workload {row['id']}",
                                      kind=row["kind"], stored=True)
            except SpecError as e:
                log.error("%s; it is failed", e)
                self.cp.store.update_workload(row["id"], state=WorkloadState.FAILED.value,
                                              end_time=self.cp.clock())
                continue
            w = Workload(row["id"], row["kind"], row["name"], row["tenant"], spec,
                         dict(row["status"]), row["secret"])
            self.unit_jobs[w.id] = {}
            jobs = self.cp.store.units(w.id)
            for job in jobs:  # oldest first: a unit's latest job wins
                self.unit_jobs[w.id][job["unit"]] = job["id"]
            for job in jobs:
                if self.unit_jobs[w.id][job["unit"]] == job["id"]:
                    self.job_unit[job["id"]] = (w.id, job["unit"])
                    if State(job["state"]).terminal:
                        self.ended_jobs[job["id"]] = State(job["state"])
            self._start(w, recovered=True)
            self._dirty.add(w.id)

    def rows(self, tenant: str | None, active: bool | None = True) -> list[dict]:
        return self.cp.store.workloads(tenant=tenant, active=active)

    # --- what units report -------------------------------------------------------------------

    def unit_token(self, job_id: int, attempt: int) -> str | None:
        """The credential an attempt of a unit's job reports with (None: not a unit)."""
        if job_id not in self.job_unit:
            return None
        return unitauth.token(self.cp.home, job_id, attempt)

    def report(self, token: str, body: Any) -> tuple[int, str]:
        """A unit's report, with its credential: checked with its controller's model and handed
        to the controller. Raises `Fenced` for an attempt that is not its unit's current one (or
        a credential of none), `SpecError` (one line naming the field) for a body its controller
        does not take. Returns (workload id, unit)."""
        job_id, attempt = unitauth.verify(self.cp.home, token)
        with self.cp._lock:
            found = self.job_unit.get(job_id)
            js = self.cp.owner.jobs.get(job_id)
            if found is None or js is None or js.attempt != attempt or js.status.terminal:
                raise Fenced(f"job {job_id} attempt {attempt} is not a running unit's current "
                             "attempt")
            w = self.active.get(found[0])
            if w is None:
                raise Fenced(f"workload {found[0]} has ended")
            ctl = self.controller(w.kind)
            model = ctl.report_model(w, found[1])
            if model is None:
                raise SpecError(f"unit {found[1]!r} of {w.kind} {w.name!r} does not report")
            try:
                parsed = model.model_validate(body)
            except ValidationError as e:
                raise SpecError(errors_message("report", e.errors(), model)) from None
            if ctl.report(w, found[1], parsed, self.ctx):
                self.cp.store.update_workload(w.id, status=w.status)
                self._dirty.add(w.id)
                self.cp.notify()
            return w.id, found[1]

"""A control plane's admission: a submission checked (`admit`), stored, and handed to the loop
(`accepted`), which takes it in at its next step (`take_incoming`) for the owner; and what the
owner asks of the store about jobs it no longer holds (`stored_state`).

Part of `plinth.control.service.ControlPlane`, which answers for it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from plinth.core.errors import SpecError, UnplaceableError
from plinth.core.jobspec import JobSpec, parse_array
from plinth.core.lifecycle import State
from plinth.core.resources import Cluster, Request
from plinth.core.workload import Job
from plinth.sched.events import Event, Submitted
from plinth.sched.holds import array_state
from plinth.sched.placement import never_fits

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane


class Admission:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.incoming: deque[tuple[Job, JobSpec]] = deque()  # accepted, not yet taken in
        self._never_fits: dict[Request, str | None] = {}  # per cluster: memoised
        self._fits_on: Cluster | None = None

    def submit(self, spec: JobSpec, tenant: str) -> int:
        """Accept a job: check it, store it, queue it. Returns its id."""
        spec, row, now = self.admit(spec, tenant)
        if spec.array:
            return self.submit_tasks(spec, row, now)[0]
        return self.accepted(self.cp.store.insert_job(row, now), spec, now)

    def admit(self, spec: JobSpec, tenant: str) -> tuple[JobSpec, dict, float]:
        """Check a submission; return the spec as stored, its store row, and the submit time.
        A job that can never fit the cluster is rejected here, with the reason."""
        cluster = self.cp.cluster
        if cluster is not self._fits_on:  # the tenants changed: a new cluster
            self._never_fits, self._fits_on = {}, cluster
        req = spec.request()
        why = self._never_fits.get(req, "")
        if why == "":
            why = self._never_fits[req] = never_fits(cluster, req)
        if why is not None:
            raise UnplaceableError(f"job {spec.name!r} can never run here: {why} "
                                   f"(cluster: {cluster.describe()})")
        if spec.array_index is not None or spec.array_id is not None:
            raise SpecError("array_index: set by the platform for the tasks of an array; "
                            "ask for one with `array: 0-99`")
        spec = spec.model_copy(update={"tenant": tenant})
        row = {"name": spec.name, "tenant": tenant, "priority": spec.priority,
               "spec": spec.model_dump(mode="json"), "reason": "queued"}
        return spec, row, self.cp.clock()

    def accepted(self, job_id: int, spec: JobSpec, now: float) -> int:
        """Queue a job the store now holds. It is handed to the loop without taking its lock,
        so a submission never waits for a scheduling pass."""
        job = spec.job(job_id, spec.tenant or "default", now)
        self.incoming.append((job, spec))
        self.cp.metrics.submitted(job.tenant, spec.kind)
        self.cp.notify()
        return job_id

    def submit_tasks(self, spec: JobSpec, row: dict, now: float) -> list[int]:
        """Store and queue the tasks of a job array (`spec.array`), one job each with its
        index; the array's id is its first task's."""
        indices, _ = parse_array(spec.array)  # type: ignore[arg-type]  # an array spec
        tasks = [spec.model_copy(update={"array_index": i}) for i in indices]
        ids = self.cp.store.insert_jobs([({**row, "spec": t.model_dump(mode="json"),
                                           "array_index": t.array_index}, now, "")
                                         for t in tasks], array=True)
        for job_id, t in zip(ids, tasks):
            self.accepted(job_id, t.model_copy(update={"array_id": ids[0]}), now)
        return ids

    def take_incoming(self) -> list[Event]:
        """New submissions, as the owner's events (it holds back those that wait on others or
        for their array's turn: plinth.sched.holds). Under the loop's lock."""
        events: list[Event] = []
        specs, incoming = self.cp.specs, self.incoming
        while incoming:
            job, spec = incoming.popleft()
            specs[job.id] = spec
            events.append(Submitted(job))
        return events

    def stored_state(self, job_id: int) -> tuple[State, bool] | None:
        """(state, has started) of a job the owner no longer holds (it ended, or was just
        submitted and not yet taken in), for the jobs that wait on it; None if there is no
        such job. An array's id stands for all its tasks, as in Slurm."""
        store = self.cp.store
        row = store.job(job_id)
        if row is None or row["array_id"] != job_id:
            return None if row is None else (State(row["state"]), row["attempt"] > 0)
        states, started = store.array_summary(job_id)
        failed = any(s.terminal and s is not State.SUCCEEDED for s in states)
        return array_state(all(s.terminal for s in states), failed, started)

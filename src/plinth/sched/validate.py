"""Checking a scheduler's decisions the way an owner applies them.

`apply_decisions` is what the simulator and the control plane do with a pass's output
(preemptions first, then resizes, then starts), on a copy of the snapshot's state, with every
check an owner relies on: each job decided on once, preemptions only of running preemptible
jobs, starts only of pending jobs, nothing both started and left waiting, and no GPU
over-committed afterwards. Tests of every policy use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from plinth.core.resources import Cluster
from plinth.core.workload import Job
from plinth.sched.placement import place_and_allocate
from plinth.sched.policies.base import Policy
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, JobStatus, SchedConfig, Snapshot


def running_job(state: ClusterState, job: Job, *, start: float = 0.0, **fields: object
                ) -> JobState:
    """A job already running since `start`, placed (and allocated) on `state`."""
    js = JobState(job, status=JobStatus.RUNNING, start_time=start, first_start=start,
                  **fields)  # type: ignore[arg-type]
    js.allocation = place_and_allocate(state, job.request)
    assert js.allocation is not None, f"job {job.id} does not fit"
    return js


def snapshot_for(policy: Policy, cluster: Cluster, state: ClusterState,
                 waiting: Iterable[JobState], running: Iterable[JobState],
                 config: SchedConfig | None = None) -> Snapshot:
    """A snapshot as an owner builds it: pending sorted by the policy's key."""
    return Snapshot(cluster, state, sorted(waiting, key=policy.order),
                    {js.id: js for js in running}, config or SchedConfig())


def apply_decisions(snap: Snapshot, d: Decisions) -> ClusterState:
    """The state after `d`; raises AssertionError if `d` is not something an owner can apply."""
    preempted = [p.job_id for p in d.preempts]
    assert len(preempted) == len(set(preempted)), f"a job preempted twice: {preempted}"
    assert set(preempted) <= set(snap.running), "preempting a job that is not running"
    pending = {js.id: js for js in snap.pending}
    started = [s.job_id for s in d.starts]
    assert len(started) == len(set(started)), f"a job started twice: {started}"
    # A job preempted in this pass may be started again in it (a Gavel swap).
    assert set(started) <= set(pending) | set(preempted), "starting a job that is not pending"
    assert not set(started) & set(d.waiting), "a job both started and left waiting"
    resized = [r.job_id for r in d.resizes]
    assert set(resized) <= set(snap.running) - set(preempted), "resizing a job not running"
    st = snap.state.copy()
    for p in d.preempts:
        js = snap.running[p.job_id]
        assert js.job.preemptible, f"job {js.id} is not preemptible"
        st.release(js.allocation, js.job.request)  # type: ignore[arg-type]
    for r in d.resizes:
        js = snap.running[r.job_id]
        st.release(js.allocation, js.job.request)  # type: ignore[arg-type]
        st.allocate(r.allocation, js.job.request)
    for s in d.starts:
        js = pending.get(s.job_id) or snap.running[s.job_id]
        st.allocate(s.allocation, js.job.request)
    st.check()
    return st

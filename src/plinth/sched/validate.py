"""Checking one pass's decisions by applying them the one way they are ever applied.

`apply_decisions` hands a snapshot and a pass's decisions to `plinth.sched.owner.Owner` (the
applier the simulator and the control plane share), on copies, and returns the plan afterwards.
It raises AssertionError where the owner would refuse the decisions: a job decided on twice,
preemption of a job not running or not preemptible, a start of a job not pending, a job both
started and left waiting, or an over-committed GPU. Tests of every policy use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from plinth.core.resources import Cluster
from plinth.core.workload import Job
from plinth.core.lifecycle import State
from plinth.sched.owner import Owner
from plinth.sched.placement import place_and_allocate
from plinth.sched.policies.base import Policy
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot


def running_job(state: ClusterState, job: Job, *, start: float = 0.0, **fields: object
                ) -> JobState:
    """A job already running since `start`, placed (and allocated) on `state`."""
    js = JobState(job, status=State.RUNNING, start_time=start, first_start=start,
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


def apply_decisions(snap: Snapshot, d: Decisions, now: float = 0.0) -> ClusterState:
    """The plan after `d`; raises AssertionError if `d` is not something the owner applies."""
    for name, ids in (("preempted", [p.job_id for p in d.preempts]),
                      ("started", [s.job_id for s in d.starts]),
                      ("moved", [r.job_id for r in d.resizes])):
        assert len(ids) == len(set(ids)), f"a job {name} twice: {ids}"
    owner = Owner.from_snapshot(snap)
    owner.apply(d, now)
    owner.state.check()
    return owner.state

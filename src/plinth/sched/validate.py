"""Checking one pass's decisions by applying them the one way they are ever applied.

`apply_decisions` hands a snapshot and a pass's decisions to `plinth.sched.owner.Owner` (the
applier the simulator and the control plane share), on copies, and returns the plan afterwards.
It raises AssertionError where the owner would refuse the decisions: a job decided on twice,
preemption of a job not running or not preemptible, a start of a job not pending, a job both
started and left waiting, or an over-committed GPU. Tests of every policy use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from plinth.core.lifecycle import State
from plinth.core.resources import Cluster
from plinth.core.workload import Job
from plinth.sched.accounting import Run
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
    owner = owner_from_snapshot(snap)
    owner.apply(d, now)
    owner.state.check()
    return owner.state


def owner_from_snapshot(snap: Snapshot, policy: Policy | None = None) -> Owner:
    """An owner holding copies of a snapshot's jobs and its cluster state, to check a pass's
    decisions in isolation."""
    owner = Owner(snap.cluster, policy or Policy(), snap.config)
    owner.state, owner.held = snap.state.copy(), snap.state.copy()
    for js in snap.pending:
        c = dataclasses.replace(js)
        owner.jobs[c.id] = c
        owner.pending.add(c)
    for js in snap.running.values():
        c = dataclasses.replace(js, status=State.RUNNING)
        owner.jobs[c.id] = c
        owner.running[c.id] = c
        owner.ends.add(c)  # its progress is current: the end is read from it
        start = c.start_time if c.start_time is not None else 0.0
        owner.runs[c.id] = Run(start, start, c.rate or 1.0, 0.0, c.progress, c.attained,
                               c.executed, c.job.request.num_gpus)
        owner.accounted[c.id] = (c, owner.runs[c.id], c.job.duration)
    return owner

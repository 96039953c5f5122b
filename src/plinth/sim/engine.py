"""A discrete-event simulator that drives the production scheduler code in virtual time.

The simulator owns the job states and the cluster state, exactly as the control plane does in
production; only the clock and the runtime are simulated. Its heap holds
(time, kind, sequence, ...) so that ties always break the same way: at one instant, finishes are
processed before arrivals, and arrivals in trace order, so the same trace gives the same numbers.

A job's progress is measured in seconds of work at reference speed (a V100, consolidated). On an
allocation it advances at `rate = speed(job type, GPU model) x locality factor`. A preempted job
loses the work since its last checkpoint; each restart pays a restore overhead first.
"""

from __future__ import annotations

import heapq
import math
import time as wallclock
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from sortedcontainers import SortedKeyList

from plinth.core.errors import UnplaceableError
from plinth.core.resources import MILLI, Allocation, Cluster, Request
from plinth.core.throughput import job_type_for, speed
from plinth.core.workload import Job
from plinth.sched.placement import locality_factor, never_fits
from plinth.sched.policies.base import Policy
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, JobStatus, SchedConfig, Snapshot

# Event kinds, in the order they are processed at one instant.
FINISH, ARRIVAL, WAKE = 0, 1, 2


@dataclass(slots=True)
class _Run:
    """Book-keeping for the current run of a running job."""

    start: float
    t0: float  # when progress begins (start + restore overhead)
    base_progress: float
    base_attained: float
    base_executed: float
    gpus: float
    version: int


@dataclass
class SimResult:
    policy: str
    cluster: Cluster
    jobs: list[JobState]
    makespan: float
    util_times: np.ndarray  # event times
    util_used: np.ndarray  # GPUs allocated from each time on
    gpu_seconds_used: float
    ftf_rho: np.ndarray  # finish-time fairness per completed job
    preemptions: int
    passes: int
    wall_s: float
    alloc_ratio_at_first_failure: float | None = None
    lost_work_s: float = 0.0


def simulate(
    jobs: Iterable[Job],
    cluster: Cluster,
    policy: Policy,
    config: SchedConfig | None = None,
    *,
    validate: bool = False,
    reject_unfit: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Replay `jobs` on `cluster` under `policy` until every job has ended.

    A job that cannot fit even the empty cluster raises `UnplaceableError` before anything
    runs, unless `reject_unfit`, which marks it rejected instead. `validate` checks the cluster
    invariants after every scheduling pass (for tests).
    """
    sim = _Simulator(list(jobs), cluster, policy, config or SchedConfig(), validate, reject_unfit)
    return sim.run(on_progress)


class _Simulator:
    def __init__(self, jobs: list[Job], cluster: Cluster, policy: Policy, cfg: SchedConfig,
                 validate: bool, reject_unfit: bool) -> None:
        self.cluster, self.policy, self.cfg, self.validate = cluster, policy, cfg, validate
        self.state = ClusterState(cluster)
        self.states = {j.id: JobState(j, pending_since=j.submit_time) for j in jobs}
        if len(self.states) != len(jobs):
            raise UnplaceableError("trace: job ids are not unique")
        self.pending = SortedKeyList(key=policy.order)
        self.running: dict[int, JobState] = {}
        self.runs: dict[int, _Run] = {}
        self.heap: list[tuple] = []
        self.seq = 0
        self.next_wake = math.inf
        self.preemptions = 0
        self.lost_work = 0.0
        self.first_failure: float | None = None
        self._check_fit(jobs, reject_unfit)
        for j in jobs:
            if self.states[j.id].status is JobStatus.PENDING:
                self._push(j.submit_time, ARRIVAL, j.id, 0)
        # Integrals for utilisation and for finish-time fairness (active jobs over time).
        self.active = 0
        self.t_last = 0.0
        self.gpu_seconds = 0.0
        self.active_integral = 0.0
        self.active_at_submit: dict[int, float] = {}
        self.ftf: list[float] = []
        self.util_t: list[float] = [0.0]
        self.util_v: list[float] = [0.0]
        self.passes = 0
        self.touched_at = -math.inf

    def _check_fit(self, jobs: list[Job], reject: bool) -> None:
        verdicts: dict[Request, str | None] = {}
        for j in jobs:
            req = j.request
            if req not in verdicts:
                verdicts[req] = never_fits(self.cluster, req)
            why = verdicts[req]
            if why is None:
                continue
            if not reject:
                where = f" (trace line {j.source_line})" if j.source_line else ""
                raise UnplaceableError(f"job {j.name or j.id}{where} can never run: {why}")
            js = self.states[j.id]
            js.status, js.reason, js.end_time = JobStatus.REJECTED, why, j.submit_time

    def _push(self, t: float, kind: int, jid: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, jid, version))

    # -- main loop ---------------------------------------------------------------------------
    def run(self, on_progress: Callable[[int, int], None] | None) -> SimResult:
        began = wallclock.perf_counter()
        total, done = len(self.states), 0
        heap = self.heap
        while heap:
            now = heap[0][0]
            self._advance(now)
            freed = arrived = wake = False
            gpu_only = True  # every arrival at this instant asks for a GPU
            while heap and heap[0][0] == now:
                _, kind, _, jid, version = heapq.heappop(heap)
                if kind == FINISH:
                    run = self.runs.get(jid)
                    if run is not None and run.version == version:
                        self._finish(self.states[jid], now)
                        done += 1
                        freed = True
                elif kind == ARRIVAL:
                    js = self.states[jid]
                    self.pending.add(js)
                    self.active += 1
                    self.active_at_submit[jid] = self.active_integral
                    arrived = True
                    gpu_only = gpu_only and js.job.request.gpu_milli_total > 0
                elif now == self.next_wake:
                    self.next_wake = math.inf
                    wake = True
            if wake or freed and (self.pending or self.policy.preemptive):
                self._pass(now)
            elif arrived and (self.policy.preemptive or not gpu_only or not self._full()):
                # An arrival to a full cluster cannot start under a non-preemptive policy.
                self._pass(now)
            if on_progress is not None and done and done % 1000 == 0:
                on_progress(done, total)
            if not heap and self.pending:
                self._pass(now)  # a last chance before declaring the policy stuck
                if not heap:
                    ids = [js.id for js in self.pending[:5]]
                    raise RuntimeError(
                        f"policy {self.policy.name} left {len(self.pending)} jobs pending with "
                        f"nothing running (first: {ids})")
        return self._result(wallclock.perf_counter() - began)

    @property
    def used_gpus(self) -> float:
        return self.state.used_milli / MILLI

    def _full(self) -> bool:
        return self.state.free_milli == 0

    def _advance(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            self.gpu_seconds += self.used_gpus * dt
            self.active_integral += self.active * dt
            self.t_last = now

    def _pass(self, now: float) -> None:
        if now != self.touched_at:  # a second pass at the same instant finds them current
            for js in self.running.values():
                self._touch(js, now)
            self.touched_at = now
        snap = Snapshot(self.cluster, self.state, self.pending, self.running, self.cfg)
        d = self.policy.schedule(snap, now)
        self.passes += 1
        self._apply(d, now)
        if d.preempts and not d.starts:
            # Preemption only freed resources: plan again at once to use them.
            d2 = self.policy.schedule(snap, now)
            self.passes += 1
            self._apply(d2, now)
            d.wake_at = min(d.wake_at or math.inf, d2.wake_at or math.inf)
            d.wake_at = None if math.isinf(d.wake_at) else d.wake_at
        if d.wake_at is not None and now < d.wake_at < self.next_wake:
            self.next_wake = d.wake_at
            self._push(d.wake_at, WAKE, -1, 0)
        if self.validate:
            self.state.check()

    def _apply(self, d: Decisions, now: float) -> None:
        for p in d.preempts:
            self._preempt(self.states[p.job_id], now, p.reason, p.checkpoint)
        for r in d.resizes:
            js = self.states[r.job_id]
            self._stop(js, now, keep_progress=True)
            self._start(js, r.allocation, r.model, now, r.reason, restore=True)
        for s in d.starts:
            js = self.states[s.job_id]
            self.pending.remove(js)
            self._start(js, s.allocation, s.model, now, s.reason, restore=js.preemptions > 0)
        for jid, why in d.waiting.items():
            self.states[jid].reason = why
        if self.first_failure is None and d.waiting:
            if any(self.states[j].job.request.gpu_milli_total and why.startswith("Resources")
                   for j, why in d.waiting.items()):
                self.first_failure = self.state.used_milli / (self.cluster.total_gpus * MILLI)
        if d.preempts or d.resizes or d.starts:
            self.util_t.append(now)
            self.util_v.append(self.used_gpus)

    # -- transitions -------------------------------------------------------------------------
    def _start(self, js: JobState, alloc: Allocation, model: str | None, now: float,
               reason: str, restore: bool) -> None:
        if js.status is not JobStatus.RUNNING and js.status is not JobStatus.PENDING:
            raise RuntimeError(f"job {js.id}: cannot start from {js.status.value}")
        req = js.job.request
        self.state.allocate(alloc, req)
        if model is None and alloc.slots and alloc.slots[0].gpus:
            model = self.cluster.nodes[alloc.slots[0].node].gpu_model
        js.status, js.allocation, js.model, js.reason = JobStatus.RUNNING, alloc, model, reason
        js.start_time = now
        if js.first_start is None:
            js.first_start = now
        jtype = js.job.job_type or job_type_for(js.id)
        js.rate = speed(jtype, model) * locality_factor(self.cluster, alloc, self.cfg.placement)
        t0 = now + (self.cfg.restore_overhead if restore else 0.0)
        gpus = req.num_gpus
        old = self.runs.get(js.id)
        version = old.version + 1 if old else 1
        self.runs[js.id] = _Run(now, t0, js.progress, js.attained, js.executed, gpus, version)
        self.running[js.id] = js
        self._push(t0 + js.remaining / js.rate, FINISH, js.id, version)

    def _touch(self, js: JobState, now: float) -> None:
        run = self.runs[js.id]
        progressed = now - run.t0
        progress = run.base_progress + js.rate * progressed if progressed > 0 else \
            run.base_progress
        duration = js.job.duration
        js.progress = progress if progress < duration else duration
        ran = now - run.start
        js.attained = run.base_attained + run.gpus * ran
        js.executed = run.base_executed + ran
        interval = self.cfg.checkpoint_interval
        if interval > 0 and js.progress - js.checkpointed >= interval:
            js.checkpointed = math.floor(js.progress / interval) * interval
            js.checkpoint_time = run.t0 + (js.checkpointed - run.base_progress) / js.rate

    def _stop(self, js: JobState, now: float, keep_progress: bool) -> None:
        self._touch(js, now)
        if not keep_progress and self.cfg.checkpoint_interval > 0:
            self.lost_work += js.progress - js.checkpointed
            js.progress = js.checkpointed
        self.state.release(js.allocation, js.job.request)  # type: ignore[arg-type]
        self.runs[js.id].version += 1  # its pending FINISH event is now stale
        del self.running[js.id]

    def _preempt(self, js: JobState, now: float, reason: str, checkpoint: bool) -> None:
        if js.status is not JobStatus.RUNNING:
            raise RuntimeError(f"job {js.id}: cannot preempt from {js.status.value}")
        self._stop(js, now, keep_progress=checkpoint)
        if checkpoint:
            js.checkpointed, js.checkpoint_time = js.progress, now
        js.status, js.allocation, js.reason = JobStatus.PENDING, None, reason
        js.preemptions += 1
        js.last_preempted = js.pending_since = now
        js.rate = 0.0
        self.preemptions += 1
        self.pending.add(js)

    def _finish(self, js: JobState, now: float) -> None:
        self._touch(js, now)
        js.progress = js.job.duration
        self.state.release(js.allocation, js.job.request)  # type: ignore[arg-type]
        del self.runs[js.id]
        del self.running[js.id]
        js.status, js.end_time = JobStatus.COMPLETED, now
        self.active -= 1
        self.util_t.append(now)
        self.util_v.append(self.used_gpus)
        self.ftf.append(self._rho(js, now))

    def _rho(self, js: JobState, now: float) -> float:
        """Themis' finish-time fairness: time taken over the time in a 1/N share of the
        cluster, N being the average number of active jobs over the job's life."""
        life = now - js.job.submit_time
        n_avg = (self.active_integral - self.active_at_submit[js.id]) / life if life > 0 else 1
        share = max(1.0, n_avg * js.job.request.num_gpus / self.cluster.total_gpus)
        ideal = js.job.duration * share
        return life / ideal if ideal > 0 else 1.0

    def _result(self, wall: float) -> SimResult:
        jobs = sorted(self.states.values(), key=lambda js: js.id)
        ends = [js.end_time for js in jobs if js.end_time is not None]
        return SimResult(
            policy=self.policy.name, cluster=self.cluster, jobs=jobs,
            makespan=max(ends, default=0.0), util_times=np.array(self.util_t),
            util_used=np.array(self.util_v), gpu_seconds_used=self.gpu_seconds,
            ftf_rho=np.array(self.ftf), preemptions=self.preemptions, passes=self.passes,
            wall_s=wall, alloc_ratio_at_first_failure=self.first_failure,
            lost_work_s=self.lost_work,
        )

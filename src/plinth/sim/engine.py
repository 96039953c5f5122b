"""The simulator: the platform's own owner of scheduling state, in virtual time.

This module is only the shell. `plinth.sched.owner.Owner` holds the job and cluster state,
calls the policy and applies its decisions, and `plinth.sched.driver.Driver` turns it and
carries out its output, exactly as inside the control plane; the simulator replaces only the
clock (a `VirtualClock` that jumps from one event to the next) and the runtime
(`plinth.runtime.sim`, which "runs" a job at the throughput model's speed and reports its start,
checkpoints and exit).

At one instant, finishes are handled before arrivals and arrivals in trace order, in one turn of
the driver, so ties always break the same way and the same trace gives the same numbers. What
the shell adds is measurement: utilisation over time, and the active-job integral behind Themis'
finish-time fairness.
"""

from __future__ import annotations

import math
import time as wallclock
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from plinth.core.clock import VirtualClock
from plinth.core.errors import UnplaceableError
from plinth.core.lifecycle import State
from plinth.core.resources import MILLI, Cluster, Request
from plinth.core.runtime import LaunchSpec, worker_launches
from plinth.core.workload import Job
from plinth.runtime.sim import SimRuntime
from plinth.runtime.sim_behaviour import Behaviour
from plinth.sched.driver import Driver
from plinth.sched.events import Launch, Output, Submitted
from plinth.sched.owner import Owner
from plinth.sched.placement import never_fits
from plinth.sched.policies.base import Policy
from plinth.sched.types import Decisions, JobState, SchedConfig

GRACE_S = 10.0  # a stop's grace, as the control plane's default (plinth.control.server)
WORKERS_CACHE = 65536  # launches' workers remembered (see `_launch_spec`)
_PENDING, _RUNNING, _STOPPING = State.PENDING, State.RUNNING, State.STOPPING


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
    behaviour: Behaviour | None = None,
) -> SimResult:
    """Replay `jobs` on `cluster` under `policy` until every job has ended.

    A job that cannot fit even the empty cluster raises `UnplaceableError` before anything
    runs, unless `reject_unfit`, which marks it rejected instead. `validate` checks the owner's
    invariants after every step (for tests). `behaviour`: what some jobs act out besides their
    work (see plinth.runtime.sim_behaviour; None: the default model for all).
    """
    return _Simulation(list(jobs), cluster, policy, config or SchedConfig(), validate,
                       reject_unfit, behaviour).run(on_progress)


class _Simulation:
    def __init__(self, jobs: list[Job], cluster: Cluster, policy: Policy, cfg: SchedConfig,
                 validate: bool, reject_unfit: bool, behaviour: Behaviour | None = None
                 ) -> None:
        if len({j.id for j in jobs}) != len(jobs):
            raise UnplaceableError("trace: job ids are not unique")
        self.cluster, self.policy = cluster, policy
        self.rejected = self._check_fit(jobs, reject_unfit)
        admitted = [j for j in jobs if j.id not in self.rejected]
        # Stable by submit time: arrivals at one instant keep their trace order.
        self.arrivals = sorted(admitted, key=lambda j: j.submit_time)
        self.owner = Owner(cluster, policy, cfg, validate=validate, on_pass=self._on_pass)
        self.jobs = {j.id: j for j in admitted}
        self._workers: dict[tuple, tuple] = {}
        self.clock = VirtualClock()
        self.runtime = SimRuntime(cluster, cfg.work_model(cluster), self.jobs, clock=self.clock,
                                  behaviour=behaviour)
        self.driver = Driver(self.owner, self.runtime, clock=self.clock,
                             launch_spec=self._launch_spec, grace_s=GRACE_S,
                             record=self._record)
        self.first_failure: float | None = None
        # Integrals for utilisation and for finish-time fairness (active jobs over time).
        self.active = 0
        self.t_last = 0.0
        self.gpu_seconds = 0.0
        self.active_integral = 0.0
        self.active_at_submit: dict[int, float] = {}
        self.ftf: list[float] = []
        self.util_t: list[float] = [0.0]
        self.util_v: list[float] = [0.0]

    def _check_fit(self, jobs: list[Job], reject: bool) -> dict[int, JobState]:
        verdicts: dict[Request, str | None] = {}
        rejected = {}
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
            rejected[j.id] = JobState(j, status=State.REJECTED, reason=why,
                                      end_time=j.submit_time)
        return rejected

    def run(self, on_progress: Callable[[int, int], None] | None) -> SimResult:
        began = wallclock.perf_counter()
        owner, driver, arrivals, clock = self.owner, self.driver, self.arrivals, self.clock
        total, i, n = len(arrivals) + len(self.rejected), 0, len(arrivals)
        used, done = 0, 0
        while True:
            t_arrival = arrivals[i].submit_time if i < n else math.inf
            t_next = driver.next_time()
            now = min(t_arrival, math.inf if t_next is None else t_next)
            if math.isinf(now):
                if owner.pending and self._last_chance(self.t_last):
                    continue
                break
            clock.to(now)
            self._advance(now)
            events = driver.poll(now)  # finishes first, then arrivals
            while i < n and arrivals[i].submit_time == now:
                events.append(Submitted(arrivals[i]))
                self.active += 1
                self.active_at_submit[arrivals[i].id] = self.active_integral
                i += 1
            driver.turn(events, now)
            if owner.state.used_milli != used:
                used = owner.state.used_milli
                self.util_t.append(now)
                self.util_v.append(used / MILLI)
            if on_progress is not None and len(self.ftf) // 1000 > done:
                done = len(self.ftf) // 1000
                on_progress(len(self.ftf), total)
        return self._result(wallclock.perf_counter() - began)

    def _launch_spec(self, ins: Launch) -> LaunchSpec:
        """What the simulated runtime needs of a launch: the job's workers."""
        req = self.jobs[ins.job_id].request
        key = (ins.allocation, req)
        workers = self._workers.get(key)
        if workers is None:  # a replay launches on the same few allocations again and again
            if len(self._workers) >= WORKERS_CACHE:
                self._workers.clear()
            workers = self._workers[key] = worker_launches(self.cluster, ins.allocation, req)
        return LaunchSpec(ins.job_id, ins.attempt, (), workers, log_path="")

    def _record(self, out: Output) -> None:
        """A job that reached its end: its finish-time fairness, at the instant it ended."""
        for t in out.transitions:  # hot: identity tests, not State.terminal
            new = t.new
            if new is not _RUNNING and new is not _PENDING and new is not _STOPPING:
                self._finished(self.owner.jobs[t.job_id], t.at)

    def _last_chance(self, now: float) -> bool:
        """Nothing left to happen but jobs still wait: one more pass, else the policy is stuck."""
        owner = self.owner
        owner.request_pass()
        self.driver.turn([], now)
        if self.driver.next_time() is None:
            ids = [js.id for js in owner.pending[:5]]
            raise RuntimeError(f"policy {self.policy.name} left {len(owner.pending)} jobs "
                               f"pending with nothing running (first: {ids})")
        return True

    def _on_pass(self, d: Decisions, now: float) -> None:
        if self.first_failure is None and d.waiting:
            jobs = self.owner.jobs
            if any(why.startswith("Resources") and jobs[j].job.request.gpu_milli_total
                   for j, why in d.waiting.items()):
                self.first_failure = self.owner.state.used_milli / (self.cluster.total_gpus
                                                                    * MILLI)

    def _advance(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            self.gpu_seconds += self.owner.state.used_milli / MILLI * dt
            self.active_integral += self.active * dt
            self.t_last = now

    def _finished(self, js: JobState, now: float) -> None:
        self.active -= 1
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
        owner = self.owner
        jobs = sorted([*owner.jobs.values(), *self.rejected.values()], key=lambda js: js.id)
        ends = [js.end_time for js in jobs if js.end_time is not None]
        return SimResult(
            policy=self.policy.name, cluster=self.cluster, jobs=jobs,
            makespan=max(ends, default=0.0), util_times=np.array(self.util_t),
            util_used=np.array(self.util_v), gpu_seconds_used=self.gpu_seconds,
            ftf_rho=np.array(self.ftf), preemptions=owner.preemptions, passes=owner.passes,
            wall_s=wall, alloc_ratio_at_first_failure=self.first_failure,
            lost_work_s=owner.lost_work,
        )

"""Themis: finish-time fairness with round-based leases (Mahajan et al., NSDI'20).

A job's finish-time fairness is rho = T_shared / T_ideal:

- T_ideal = duration estimate x max(1, N x gpus / C): how long it would take on a 1/N share of
  the C-GPU cluster, N being the number of active (running and pending) jobs. A job smaller
  than its share runs at full speed, so the factor is never below 1.
- T_shared = (now - submit) + remaining estimate / rate: the time already spent plus the time
  still needed at the rate it gets when allocated (its current rate while running; while
  waiting, the mean speed of its type over the GPUs it may use, weighted by their number).

rho > 1 means the job is doing worse than in its own 1/N slice of the cluster. Every
`config.round_s` the leases end and Themis offers the GPUs to the jobs with the worst rho.

Fairness knob f (default 0.8, as in the paper): only the fraction (1 - f) of jobs with the
largest rho (at least one job), the 20% worst by default, are offered resources. This is how we
read the paper's "resources are offered to the 1-f fraction of apps with the worst rho": f = 1
offers to the single worst job (strict fairness), f = 0 to everybody. The paper then runs a
partial-allocation auction among those offered to pick an efficient split; we replace the
auction by a greedy pass, largest rho first, each job placed on the model that consolidates it
best (fewest nodes), then the fastest for its type. An offered job that does not fit may take
GPUs from running jobs with a lower rho (least deserving first), honouring `can_preempt`
(non-preemptible jobs, min_runtime with backoff, max_preemptions). So f bounds how many jobs
may claim GPUs, and cause preemptions, per round: f = 1 lets only the worst job claim, f = 0
re-sorts the whole cluster by rho every round. What is left after the offer
goes, work-conservingly, to the other waiting jobs in rho order without preempting anybody;
running jobs that nobody claimed keep their lease. Between round boundaries, passes only start
waiting jobs on free GPUs.

Like Gavel, only the `max_jobs` oldest waiting jobs compete (all running jobs do), and at most
`reclaim_depth` offered jobs per round search for leases to reclaim (each search copies the
cluster state), so a pass stays cheap on large queues.
"""

from __future__ import annotations

import math
from itertools import islice

import numpy as np

from plinth.core.errors import SpecError
from plinth.core.resources import Allocation, Cluster
from plinth.core.throughput import job_type_for, speed
from plinth.sched.placement import place
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import can_preempt, find_victims, victim_order
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, Snapshot, Start


class Themis(Policy):
    """Themis: each round, leases go to the jobs with the worst finish-time fairness."""

    name = "themis"
    preemptive = True

    def __init__(self, *, fairness_knob: float = 0.8, max_jobs: int = 1000,
                 reclaim_depth: int = 16) -> None:
        if not 0.0 <= fairness_knob <= 1.0:
            raise SpecError(f"themis.fairness_knob: must be in [0, 1], got {fairness_knob}")
        if max_jobs < 1:
            raise SpecError(f"themis.max_jobs: must be at least 1, got {max_jobs}")
        if reclaim_depth < 0:
            raise SpecError(f"themis.reclaim_depth: must not be negative, got {reclaim_depth}")
        self.fairness_knob = fairness_knob
        self.max_jobs = max_jobs
        self.reclaim_depth = reclaim_depth
        self._round_end = -math.inf
        self._mean_speed: dict[tuple, float] = {}  # (type, allowed models) -> speed if waiting
        self._cluster: Cluster | None = None

    # -- finish-time fairness ----------------------------------------------------------------
    def rho(self, jobs: list[JobState], now: float, n_active: int, cluster: Cluster
            ) -> np.ndarray:
        """Finish-time fairness of each job, vectorised over the arrays read once from them."""
        if self._cluster is not cluster:
            self._cluster, self._mean_speed = cluster, {}
        est = np.array([js.job.estimate for js in jobs], dtype=float)
        remaining = np.array([js.remaining_estimate for js in jobs], dtype=float)
        submit = np.array([js.job.submit_time for js in jobs], dtype=float)
        gpus = np.array([js.job.request.num_gpus for js in jobs], dtype=float)
        rate = np.array([self._rate(js, cluster) for js in jobs], dtype=float)
        ideal = np.maximum(est, 1.0) * np.maximum(1.0, n_active * gpus / cluster.total_gpus)
        shared = (now - submit) + remaining / rate
        return shared / ideal

    def _rate(self, js: JobState, cluster: Cluster) -> float:
        jtype = js.job.job_type or job_type_for(js.id)
        if js.allocation is not None and js.rate > 0:
            return js.rate
        if js.allocation is not None and js.model is not None:
            return speed(jtype, js.model)
        key = (jtype, js.job.request.gpu_models)
        if key not in self._mean_speed:
            n = [(cluster.gpus_of_model(m), speed(jtype, m)) for m in cluster.models
                 if js.job.request.allows(m)]
            total = sum(c for c, _ in n)
            self._mean_speed[key] = sum(c * s for c, s in n) / total if total else 1.0
        return max(self._mean_speed[key], 1e-9)

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        waiting = list(islice(snap.pending, self.max_jobs))
        for js in islice(snap.pending, self.max_jobs, self.max_jobs + snap.config.backfill_depth):
            d.waiting[js.id] = f"outside Themis' window (the {self.max_jobs} oldest waiting jobs)"
        boundary = now >= self._round_end - 1e-9
        # Mid-round only waiting jobs are placed, so only their rho is needed.
        jobs = list(snap.running.values()) + waiting if boundary else waiting
        if not jobs:
            return d
        rho = self.rho(jobs, now, len(snap.running) + len(snap.pending), snap.cluster)
        # Worst rho first; ties go to the older job.
        submit = np.array([js.job.submit_time for js in jobs])
        ids = np.array([js.id for js in jobs])
        order = np.lexsort((ids, submit, -rho)).tolist()
        work = snap.state.copy()
        if boundary:
            self._round_end = now + snap.config.round_s
            self._new_round(snap, now, work, jobs, rho, order, d)
        else:
            for i in order:
                js = jobs[i]
                if not self._try_start(snap, work, js, d, f"Themis: mid-round, free GPUs "
                                       f"(rho={rho[i]:.2f})"):
                    d.waiting[js.id] = (f"Themis: rho={rho[i]:.2f}; waiting for the next round "
                                        f"at t={self._round_end:.0f}s")
        # On an idle cluster every waiting job was just tried; time alone changes nothing,
        # so do not ask to be woken (the owner then reports the jobs as stuck).
        busy = d.starts or len(snap.running) > len(d.preempts)
        d.wake_at = self._round_end if busy else None
        return d

    def _new_round(self, snap: Snapshot, now: float, work: ClusterState, jobs: list[JobState],
                   rho: np.ndarray, order: list[int], d: Decisions) -> None:
        k = max(1, math.ceil((1.0 - self.fairness_knob) * len(jobs)))
        offered = order[:k]
        cut = rho[offered[-1]]
        by_id = {js.id: i for i, js in enumerate(jobs)}
        # Leases that may be reclaimed, lowest rho first; built on first need. Offered jobs
        # are visited worst rho first and a running one renews its lease when its turn comes,
        # so whatever is still in the pool then has a better (lower) rho than its claimant.
        pool: list[JobState] | None = None
        taken: set[int] = set()  # renewed or reclaimed
        tries = self.reclaim_depth
        for i in offered:
            js = jobs[i]
            if js.id in snap.running:
                taken.add(js.id)
                continue
            why = (f"Themis: among the {k} jobs with the worst finish-time fairness "
                   f"(rho={rho[i]:.2f})")
            if self._try_start(snap, work, js, d, why):
                continue
            if tries > 0:
                tries -= 1
                if pool is None:
                    key = victim_order(lambda v: rho[by_id[v.id]])
                    pool = sorted((v for v in snap.running.values()
                                   if can_preempt(v, now, snap.config)), key=key)
                if self._try_reclaim(snap, now, work, js, rho[i], pool, taken, by_id, rho, d,
                                     why):
                    continue
            d.waiting[js.id] = (f"Themis: rho={rho[i]:.2f} is among the {k} worst, but no GPUs "
                                "are free and no lease can be reclaimed")
        for i in order[k:]:
            js = jobs[i]
            if js.id in snap.running:
                continue
            if not self._try_start(snap, work, js, d, f"Themis: leftover GPUs (rho={rho[i]:.2f})"):
                d.waiting[js.id] = (f"Themis: rho={rho[i]:.2f}; this round's GPUs went to the "
                                    f"{k} jobs with rho >= {cut:.2f}")

    def _try_reclaim(self, snap: Snapshot, now: float, work: ClusterState, js: JobState,
                     r: float, pool: list[JobState], taken: set[int], by_id: dict[int, int],
                     rho: np.ndarray, d: Decisions, why: str) -> bool:
        """Preempt running jobs with a lower rho, least deserving first, until `js` fits."""
        cands = [v for v in pool if v.id not in taken]
        if not cands:
            return False
        found = find_victims(work, js.job.request, cands, now, snap.config)
        if found is None:
            return False
        victims, _, alloc = found
        # find_victims released the victims on a copy; do the same on this pass's state.
        for v in victims:
            work.release(v.allocation, v.job.request)  # type: ignore[arg-type]
            taken.add(v.id)
            d.preempts.append(Preempt(v.id, f"Themis: lease ended; job {js.id} has worse "
                                      f"finish-time fairness (rho {r:.2f} > "
                                      f"{rho[by_id[v.id]]:.2f})", checkpoint=True))
        alloc = self._place(snap, work, js) or alloc
        work.allocate(alloc, js.job.request)
        d.starts.append(Start(js.id, alloc, why, _model(snap.cluster, alloc)))
        return True

    def _try_start(self, snap: Snapshot, work: ClusterState, js: JobState, d: Decisions,
                   why: str) -> bool:
        alloc = self._place(snap, work, js)
        if alloc is None:
            return False
        work.allocate(alloc, js.job.request)
        d.starts.append(Start(js.id, alloc, why, _model(snap.cluster, alloc)))
        return True

    def _place(self, snap: Snapshot, work: ClusterState, js: JobState) -> Allocation | None:
        """The allocation on the fewest nodes over the models the job may use; among equally
        consolidated ones, the fastest model for its type."""
        req = js.job.request
        if req.gpu_milli_total == 0 or len(snap.cluster.models) == 1:
            return place(work, req, snap.config.placement)
        if work.known_unplaceable(req):
            return None
        jtype = js.job.job_type or job_type_for(js.id)
        best, best_key = None, None
        for m in snap.cluster.models:
            if not req.allows(m):
                continue
            alloc = place(work, req, snap.config.placement, models=(m,))
            if alloc is None:
                continue
            key = (len(alloc.nodes), -speed(jtype, m))
            if best_key is None or key < best_key:
                best, best_key = alloc, key
        if best is None:
            work.mark_unplaceable(req)  # the state only fills up during a pass
        return best


def _model(cluster: Cluster, alloc: Allocation) -> str | None:
    if not alloc.slots or not alloc.slots[0].gpus:
        return None
    return cluster.nodes[alloc.slots[0].node].gpu_model

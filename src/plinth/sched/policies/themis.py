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
waiting jobs on free GPUs. With `config.round_s = 0` ("rounds off") every pass is a round
boundary: leases are re-decided at every event (an arrival, a completion).

Speeds come from the snapshot's `config.throughputs`. What rho needs from a job that does not
change while it is active (estimate, submit time, gang size, its waiting speed) is kept in numpy
arrays with one row per job, so a pass reads only each job's progress. Between boundaries only
the waiting jobs that could fit what is free are ranked, and a round with nobody waiting changes
nothing. Reasons: every waiting job gets one at each round boundary; between boundaries only
newcomers do (the others' has not changed). None of this changes a decision.

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
from plinth.core.throughput import DEFAULT_THROUGHPUTS, Throughputs
from plinth.sched.placement import place
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import can_preempt, find_victims, victim_order
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, Snapshot, Start


class Themis(Policy):
    """Themis: each round, leases go to the jobs with the worst finish-time fairness."""

    name = "themis"
    preemptive = True
    requires = frozenset({"checkpoint"})
    round_based = True  # leases last `config.round_s` (0: re-decided at every event)

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
        self._cluster: Cluster | None = None
        self._thr: Throughputs = DEFAULT_THROUGHPUTS
        self._book = _Book()
        self._outside_why = f"outside Themis' window (the {max_jobs} oldest waiting jobs)"

    def _sync(self, cluster: Cluster, thr: Throughputs) -> None:
        """Per-job speeds depend on the cluster and the matrix: start afresh if either changed."""
        if cluster is not self._cluster or thr is not self._thr:
            self._cluster, self._thr, self._book = cluster, thr, _Book()
            self._last_jobs: list[JobState] = []
            self._last_rows = np.zeros(0, dtype=np.intp)

    # -- finish-time fairness ----------------------------------------------------------------
    def rho(self, jobs: list[JobState], now: float, n_active: int, cluster: Cluster,
            throughputs: Throughputs | None = None) -> np.ndarray:
        """Finish-time fairness of each job, vectorised over the arrays read once from them."""
        self._sync(cluster, throughputs or self._thr)
        return self._rho(jobs, self._rows(jobs)[0], now, n_active)

    def _rho(self, jobs: list[JobState], rows: np.ndarray, now: float, n_active: int,
             n_running: int | None = None) -> np.ndarray:
        """`n_running`: the first jobs are the running ones (else each job is looked at)."""
        b = self._book
        est = b.est[rows]
        progress = np.array([js.progress for js in jobs], dtype=float)
        remaining = np.maximum(0.0, est - progress)
        rate = b.rate[rows].copy()  # while waiting: the mean speed over its GPUs
        if n_running is None:
            running = [i for i, js in enumerate(jobs) if js.allocation is not None]
        else:
            running = list(range(n_running))
        if running:
            now_rate = [jobs[i].rate for i in running]
            if min(now_rate) <= 0:  # not started yet: the speed of its model
                now_rate = [self._running_rate(jobs[i]) for i in running]
            rate[running] = now_rate
        total = self._cluster.total_gpus  # type: ignore[union-attr]
        ideal = np.maximum(est, 1.0) * np.maximum(1.0, n_active * b.gpus[rows] / total)
        shared = (now - b.submit[rows]) + remaining / rate
        return shared / ideal

    def _running_rate(self, js: JobState) -> float:
        if js.rate > 0:
            return js.rate
        if js.model is not None:
            return self._thr.speed(self._thr.type_of(js.job), js.model)
        return self._book.rate[self._book.row[js.id]]

    def _rows(self, jobs: list[JobState]) -> tuple[np.ndarray, list[int]]:
        """The jobs' rows in the book, added on first sight, and the indices of the new."""
        b = self._book
        if jobs == self._last_jobs:  # the same job objects as last time (an identity check)
            return self._last_rows, []
        get = b.row.get
        rows = [get(js.id, -1) for js in jobs]
        fresh = [i for i, r in enumerate(rows) if r < 0] if -1 in rows else []
        for i in fresh:
            rows[i] = b.add(jobs[i], self._waiting_rate(jobs[i]))
        self._last_jobs, self._last_rows = jobs, np.array(rows, dtype=np.intp)
        return self._last_rows, fresh

    def _waiting_rate(self, js: JobState) -> float:
        """A waiting job's expected speed: its type's mean over the GPUs it may use, weighted
        by their number."""
        jtype = self._thr.type_of(js.job)
        key = (jtype, js.job.request.gpu_models)
        rate = self._book.mean_speed.get(key)
        if rate is None:
            cluster, thr = self._cluster, self._thr
            n = [(cluster.gpus_of_model(m), thr.speed(jtype, m))  # type: ignore[union-attr]
                 for m in cluster.models  # type: ignore[union-attr]
                 if js.job.request.allows(m)]
            total = sum(c for c, _ in n)
            rate = max(sum(c * s for c, s in n) / total if total else 1.0, 1e-9)
            self._book.mean_speed[key] = rate
        return rate

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        self._sync(snap.cluster, snap.config.throughputs)
        waiting = list(islice(snap.pending, self.max_jobs))
        why_out = self._outside_why
        boundary = snap.config.round_s <= 0 or now >= self._round_end - 1e-9
        # Reasons: all at a round boundary; between boundaries only the new ones.
        for js in islice(snap.pending, self.max_jobs, self.max_jobs + snap.config.backfill_depth):
            if boundary or js.reason is not why_out:
                d.waiting[js.id] = why_out
        n_active = len(snap.running) + len(snap.pending)
        if boundary:
            self._round_end = now + snap.config.round_s
            jobs = list(snap.running.values()) + waiting
            if waiting:  # with nobody waiting every lease is renewed: nothing changes
                rows = self._rows(jobs)[0]
                if len(self._book.row) > 2 * len(jobs) + 256:  # now and then, not every round
                    self._book.forget({js.id for js in jobs})
                    self._last_jobs = []  # its rows may have been freed
                rho = self._rho(jobs, rows, now, n_active, len(snap.running))
                self._new_round(snap, now, snap.state.copy(), jobs, rows, rho,
                                self._by_rho(rows, rho), d)
        elif waiting:
            self._mid_round(snap, now, waiting, n_active, d)
        # On an idle cluster every waiting job was just tried; time alone changes nothing,
        # so do not ask to be woken (the owner then reports the jobs as stuck).
        busy = d.starts or len(snap.running) > len(d.preempts)
        d.wake_at = self._round_end if busy and snap.config.round_s > 0 else None
        return d

    def _by_rho(self, rows: np.ndarray, rho: np.ndarray) -> list[int]:
        """Worst rho first; ties go to the older job."""
        b = self._book
        return np.lexsort((b.jid[rows], b.submit[rows], -rho)).tolist()

    def _mid_round(self, snap: Snapshot, now: float, waiting: list[JobState], n_active: int,
                   d: Decisions) -> None:
        """Start waiting jobs on free GPUs, worst rho first, without preempting anybody. Only
        the jobs that could fit what is free are ranked (a ranking of the others would change
        nothing), and only newcomers get a reason: the others keep their round's."""
        b = self._book
        rows, fresh = self._rows(waiting)
        state = snap.state
        fits = b.cpu_only[rows].copy()
        if state.free_milli > 0:
            fits |= b.fraction[rows] | (b.gpus[rows] <= state.whole_free_gpus())
        cand = np.flatnonzero(fits)
        started: set[int] = set()
        if cand.size:
            jobs = [waiting[i] for i in cand.tolist()]
            crows = rows[cand]
            rho = self._rho(jobs, crows, now, n_active).tolist()
            work = state.copy()
            cpu, frac = b.cpu_only[crows].tolist(), b.fraction[crows].tolist()
            gpus = b.gpus[crows].tolist()
            cpu_left = sum(cpu)
            free, whole = work.free_milli, work.whole_free_gpus()
            for k in self._by_rho(crows, np.array(rho)):
                js = jobs[k]
                if (cpu[k] or free > 0 and (frac[k] or gpus[k] <= whole)) and self._try_start(
                        snap, work, js, d, f"Themis: mid-round, free GPUs (rho={rho[k]:.2f})"):
                    started.add(js.id)
                    free, whole = work.free_milli, work.whole_free_gpus()
                cpu_left -= cpu[k]
                if not cpu_left and free <= 0:
                    break  # every GPU is taken and no job left needs none
        fresh = [i for i in fresh if waiting[i].id not in started]
        if fresh:
            jobs = [waiting[i] for i in fresh]
            rho = self._rho(jobs, rows[fresh], now, n_active)
            for k, js in enumerate(jobs):
                d.waiting[js.id] = (f"Themis: rho={rho[k]:.2f}; waiting for the next round "
                                    f"at t={self._round_end:.0f}s")

    def _new_round(self, snap: Snapshot, now: float, work: ClusterState, jobs: list[JobState],
                   rows: np.ndarray, rho: np.ndarray, order: list[int], d: Decisions) -> None:
        """`jobs` are the running jobs, then the waiting ones."""
        b = self._book
        n_run = len(snap.running)
        k = max(1, math.ceil((1.0 - self.fairness_knob) * len(jobs)))
        offered = order[:k]
        r = rho.tolist()
        cut = r[offered[-1]]
        cpu, frac = b.cpu_only[rows].tolist(), b.fraction[rows].tolist()
        gpus = b.gpus[rows].tolist()
        free = [work.free_milli, work.whole_free_gpus()]  # kept current as `work` changes

        def may_fit(i: int) -> bool:  # a cheap necessary condition for a start
            return cpu[i] or free[0] > 0 and (frac[i] or gpus[i] <= free[1])

        def changed() -> None:
            free[0], free[1] = work.free_milli, work.whole_free_gpus()

        # Leases that may be reclaimed, lowest rho first; built on first need. Offered jobs
        # are visited worst rho first and a running one renews its lease when its turn comes,
        # so whatever is still in the pool then has a better (lower) rho than its claimant.
        pool: list[JobState] | None = None
        by_id: dict[int, int] = {}
        taken: set[int] = set()  # renewed or reclaimed
        tries = self.reclaim_depth
        for i in offered:
            js = jobs[i]
            if i < n_run:
                taken.add(js.id)
                continue
            why = (f"Themis: among the {k} jobs with the worst finish-time fairness "
                   f"(rho={r[i]:.2f})")
            if may_fit(i) and self._try_start(snap, work, js, d, why):
                changed()
                continue
            if tries > 0:
                tries -= 1
                if pool is None:
                    by_id = {v.id: j for j, v in enumerate(jobs[:n_run])}
                    key = victim_order(lambda v: r[by_id[v.id]])
                    pool = sorted((v for v in snap.running.values()
                                   if can_preempt(v, now, snap.config)), key=key)
                if self._try_reclaim(snap, now, work, js, r[i], pool, taken, by_id, rho, d,
                                     why):
                    changed()
                    continue
            d.waiting[js.id] = (f"Themis: rho={r[i]:.2f} is among the {k} worst, but no GPUs "
                                "are free and no lease can be reclaimed")
        rest = [i for i in order[k:] if i >= n_run]
        cpu_left = sum(cpu[i] for i in rest)
        why = f"; this round's GPUs went to the {k} jobs with rho >= {cut:.2f}"
        for n, i in enumerate(rest):
            if not cpu_left and free[0] <= 0:
                # Every GPU is taken and nobody left can do without one: the rest just wait.
                d.waiting.update((jobs[i].id, f"Themis: rho={r[i]:.2f}{why}")
                                 for i in rest[n:])
                break
            cpu_left -= cpu[i]
            js = jobs[i]
            if may_fit(i) and self._try_start(snap, work, js, d,
                                              f"Themis: leftover GPUs (rho={r[i]:.2f})"):
                changed()
                continue
            d.waiting[js.id] = f"Themis: rho={r[i]:.2f}{why}"

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
        jtype = self._thr.type_of(js.job)
        best, best_key = None, None
        for m in snap.cluster.models:
            if not req.allows(m):
                continue
            alloc = place(work, req, snap.config.placement, models=(m,))
            if alloc is None:
                continue
            key = (len(alloc.nodes), -self._thr.speed(jtype, m))
            if best_key is None or key < best_key:
                best, best_key = alloc, key
        if best is None:
            work.mark_unplaceable(req)  # the state only fills up during a pass
        return best



class _Book:
    """What Themis reads from a job on every pass that does not change while the job is
    active, as numpy arrays with one row per job (rows reused once a job leaves)."""

    def __init__(self) -> None:
        self.row: dict[int, int] = {}
        self.free: list[int] = []
        self.size = 0
        self.mean_speed: dict[tuple, float] = {}  # (type, allowed models) -> speed if waiting
        self._grow(256)

    def _grow(self, n: int) -> None:
        old = self.size
        for name, dtype in (("est", float), ("submit", float), ("gpus", float),
                            ("rate", float), ("cpu_only", bool), ("fraction", bool),
                            ("jid", np.int64)):
            a = np.zeros(n, dtype=dtype)
            if old:
                a[:old] = getattr(self, name)
            setattr(self, name, a)
        self.free.extend(range(n - 1, old - 1, -1))
        self.size = n

    def add(self, js: JobState, waiting_rate: float) -> int:
        if not self.free:
            self._grow(2 * self.size)
        r = self.free.pop()
        self.row[js.id] = r
        job, req = js.job, js.job.request
        self.est[r], self.submit[r], self.gpus[r] = job.estimate, job.submit_time, req.num_gpus
        self.jid[r] = job.id
        self.rate[r] = waiting_rate
        self.cpu_only[r], self.fraction[r] = req.gpu_milli_total == 0, req.fractional
        return r

    def forget(self, keep: set[int]) -> None:
        """Free the rows of jobs not in `keep` (finished, or out of the window)."""
        for jid in [j for j in self.row if j not in keep]:
            self.free.append(self.row.pop(jid))


def _model(cluster: Cluster, alloc: Allocation) -> str | None:
    if not alloc.slots or not alloc.slots[0].gpus:
        return None
    return cluster.nodes[alloc.slots[0].node].gpu_model

"""Gavel: heterogeneity-aware max-min fairness with round-based leases (Narayanan et al.,
OSDI'20).

Two layers, as in the paper:

1. An allocation. For the active jobs, `plinth.sched.lp.max_min_fairness` picks time fractions
   X[j, m] on each GPU model m that maximise the smallest normalised throughput (throughput over
   what the job would get from an equal 1/N share of the cluster). Throughputs come from
   `plinth.core.throughput.speed`. The LP is solved again only when the set of active jobs
   has changed, and then at the next round boundary (at most once per round).
2. A round-based mechanism that realises X over time. At each round boundary (every
   `config.round_s`, 6 minutes by default) every (job, model) pair gets priority
   X[j, m] / (share of its active time the job has run on m so far); a pair never run gets
   infinite priority. Pairs are granted greedily by priority while the model has GPUs left.
   Jobs that keep their model keep their GPUs (no migration); jobs granted another model are
   moved (`Resize`); running jobs granted nothing are preempted, unless their GPUs stay idle
   anyway, in which case they keep running. Between boundaries, passes only start waiting jobs
   on free GPUs; nobody is moved or preempted before the round ends.

Choices and simplifications, each for a reason:

- The active set is the `max_jobs` oldest jobs (running and pending, by submit time), so the LP
  stays small on large queues. Later jobs wait with "outside Gavel's active window".
- Scale factors: a gang counts as `request.num_gpus` GPUs, fractional shares as their fraction.
  The LP ignores locality; placement still consolidates gangs on one model.
- Gavel's lease is the job's guarantee, so SchedConfig's min_runtime and preemption backoff
  (meant for priority preemption) are not applied unless `use_min_runtime=True`; jobs marked
  not preemptible are never moved or preempted and hold their GPUs in the count.
- A job checkpoints when its lease ends (`Preempt(checkpoint=True)`), as Gavel assumes, so
  rotating jobs every round loses no work.
- The owner applies resizes one at a time (release, then allocate), so moves are emitted in an
  order where no move needs GPUs another mover still holds. A swap (a cycle) cannot be ordered:
  the member with the least unsaved work is preempted and started again after the resizes.
- Jobs that need no GPU are started wherever they fit and never preempted.
- Bookkeeping (time active, time received per model) lives in this object between calls and is
  updated from the snapshot: a running job is charged for the time since the previous call on
  the model its allocation is on. A job that leaves the active set loses its history.
"""

from __future__ import annotations

import math
from itertools import islice

import numpy as np

from plinth.core.errors import SpecError
from plinth.core.resources import Allocation, Cluster, Request
from plinth.core.throughput import job_type_for, speed
from plinth.sched.lp import feasible_mask, max_min_fairness
from plinth.sched.placement import place
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import can_preempt
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, Resize, Snapshot, Start

_X_MIN = 1e-4  # time fractions below this are solver noise, not an allocation


class Gavel(Policy):
    """Gavel: heterogeneity-aware max-min fairness (HiGHS LP) with round-based leases."""

    name = "gavel"
    preemptive = True

    def __init__(self, *, max_jobs: int = 1000, use_min_runtime: bool = False) -> None:
        if max_jobs < 1:
            raise SpecError(f"gavel.max_jobs: must be at least 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self.use_min_runtime = use_min_runtime
        self._reset(())

    def _reset(self, models: tuple[str, ...]) -> None:
        self._models = models
        self._lp_key: tuple[int, ...] | None = None
        self._X: dict[int, np.ndarray] = {}  # job id -> time fraction per model
        self._T: dict[int, np.ndarray] = {}  # job id -> its speed on each model
        self.fairness = 0.0  # the LP's t, for reports
        self._received: dict[int, np.ndarray] = {}  # job id -> seconds run on each model
        self._active_time: dict[int, float] = {}
        self._prev_active: tuple[int, ...] = ()
        self._last_now: float | None = None
        self._round_end = -math.inf

    # -- bookkeeping -------------------------------------------------------------------------
    def allocation(self, job_id: int) -> np.ndarray | None:
        """The job's current time fractions per model (cluster.models order), if active."""
        return self._X.get(job_id)

    def received_share(self, job_id: int) -> np.ndarray:
        """The share of its active time the job has run on each model so far."""
        got = self._received.get(job_id)
        active = self._active_time.get(job_id, 0.0)
        if got is None or active <= 0:
            return np.zeros(len(self._models))
        return got / active

    def _account(self, snap: Snapshot, now: float) -> None:
        if self._models != snap.cluster.models:  # a new cluster: start from scratch
            self._reset(snap.cluster.models)
        dt = 0.0 if self._last_now is None else now - self._last_now
        self._last_now = now
        if dt <= 0:
            return
        for jid in self._prev_active:
            self._active_time[jid] = self._active_time.get(jid, 0.0) + dt
        for js in snap.running.values():
            m = _model_index(snap.cluster, js.allocation)
            if m >= 0:
                got = self._received.setdefault(js.id, np.zeros(len(self._models)))
                got[m] += dt

    def _solve(self, snap: Snapshot, jobs: list[JobState], boundary: bool) -> None:
        key = tuple(js.id for js in jobs)
        if key == self._lp_key:
            return
        if not boundary:
            # Mid-round nobody is moved, so a new allocation could only reorder who gets the
            # GPUs freed until the round ends. Solve at the boundary instead (at most one LP per
            # round); newcomers meanwhile get an even split over the models they can use,
            # which with their infinite priority (never run) puts them first, fastest model
            # first.
            new = [js for js in jobs if js.id not in self._X]
            T, scale, cap, allowed = self._lp_inputs(snap, new)
            ok = feasible_mask(T, scale, cap, allowed)
            for i, js in enumerate(new):
                self._X[js.id] = ok[i] / max(1, ok[i].sum())
                self._T[js.id] = T[i]
            return
        T, scale, cap, allowed = self._lp_inputs(snap, jobs)
        res = max_min_fairness(T, scale, cap, allowed=allowed)
        self._X = {js.id: res.X[i] for i, js in enumerate(jobs)}
        self._T = {js.id: T[i] for i, js in enumerate(jobs)}
        self.fairness = res.t
        self._lp_key = key
        keep = set(key) | set(snap.running)
        for d in (self._received, self._active_time):
            for jid in [j for j in d if j not in keep]:
                del d[jid]

    def _lp_inputs(self, snap: Snapshot, jobs: list[JobState]) -> tuple[np.ndarray, ...]:
        models = self._models
        cap = np.array([snap.cluster.gpus_of_model(m) for m in models], dtype=float)
        T = throughput_matrix(jobs, models)
        scale = np.array([js.job.request.num_gpus for js in jobs], dtype=float)
        allowed = np.array([[js.job.request.allows(m) for m in models] for js in jobs],
                           dtype=bool).reshape(len(jobs), len(models))
        return T, scale, cap, allowed

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        self._account(snap, now)
        cfg = snap.config
        window, outside = self._window(snap)
        for js in outside:
            d.waiting[js.id] = f"outside Gavel's active window (the {self.max_jobs} oldest jobs)"
        gpu_jobs = [js for js in window if js.job.request.gpu_milli_total > 0]
        boundary = now >= self._round_end - 1e-9
        self._solve(snap, gpu_jobs, boundary)
        usable = [js for js in gpu_jobs if self._X[js.id].sum() > _X_MIN]
        for js in gpu_jobs:
            if self._X[js.id].sum() <= _X_MIN and js.id not in snap.running:
                d.waiting[js.id] = "Gavel: no GPU model it may use has room for the gang"
        self._prev_active = tuple(js.id for js in gpu_jobs)

        work = snap.state.copy()
        pairs = self._pairs(snap.cluster, usable)
        if boundary:
            self._round_end = now + cfg.round_s
            self._new_round(snap, now, work, usable, pairs, d)
        else:
            running = set(snap.running)
            waiting = [(i, m) for i, m in pairs if usable[i].id not in running]
            self._fill(snap, work, usable, waiting, d, set())
        # Jobs that need no GPU never compete for the LP's resources.
        for js in window:
            if js.job.request.gpu_milli_total == 0 and js.id not in snap.running:
                alloc = place(work, js.job.request, cfg.placement)
                if alloc is not None:
                    work.allocate(alloc, js.job.request)
                    d.starts.append(Start(js.id, alloc, "Gavel: needs no GPU, fits now"))
                else:
                    d.waiting[js.id] = "Resources: no node has the CPU or memory free"
        d.wake_at = self._round_end if _busy(snap, d) else None
        return d

    def _window(self, snap: Snapshot) -> tuple[list[JobState], list[JobState]]:
        head = list(islice(snap.pending, self.max_jobs + snap.config.backfill_depth))
        jobs = sorted(head + list(snap.running.values()), key=self.order)
        window = jobs[:self.max_jobs]
        outside = [js for js in jobs[self.max_jobs:] if js.id not in snap.running]
        return window, outside

    def _pairs(self, cluster: Cluster, jobs: list[JobState]) -> list[tuple[int, int]]:
        """(job index, model index) pairs with X > 0, highest Gavel priority first."""
        if not jobs:
            return []
        X = np.stack([self._X[js.id] for js in jobs])
        share = np.stack([self.received_share(js.id) for js in jobs])
        with np.errstate(divide="ignore", invalid="ignore"):
            prio = np.where(share > 0, X / share, np.inf)
        T = np.stack([self._T[js.id] for js in jobs])
        ji, mi = np.nonzero(X > _X_MIN)
        stay = np.array([_model_index(cluster, js.allocation) for js in jobs])[ji] == mi
        # Ties (e.g. every pair never run) go to the job already there (no migration), then
        # the larger allocation, then the faster model, then the older job. Rounding keeps
        # solver noise from deciding.
        order = np.lexsort((ji, -T[ji, mi], -np.round(X[ji, mi], 6), ~stay,
                            -np.round(prio[ji, mi], 6)))
        return list(zip(ji[order].tolist(), mi[order].tolist()))

    def _new_round(self, snap: Snapshot, now: float, work: ClusterState,
                   jobs: list[JobState], pairs: list[tuple[int, int]], d: Decisions) -> None:
        cluster, models = snap.cluster, self._models
        cap = np.array([cluster.gpus_of_model(m) for m in models], dtype=float)
        used = np.zeros(len(models))
        index = {js.id: i for i, js in enumerate(jobs)}
        assigned: dict[int, int] = {}  # job index -> model index
        movable: dict[int, JobState] = {}
        for js in snap.running.values():
            m = _model_index(cluster, js.allocation)
            if m < 0:
                continue
            if self._pinned(js, now, snap):
                used[m] += js.job.request.num_gpus
                if js.id in index:
                    assigned[index[js.id]] = m
            else:
                movable[js.id] = js
        # Grant pairs by priority while the model has GPUs left (a count; placement below
        # may still fail on fragmentation, and the fill pass then tries the job's other models).
        for i, m in pairs:
            scale = jobs[i].job.request.num_gpus
            if i not in assigned and used[m] + scale <= cap[m] + 1e-9:
                assigned[i] = m
                used[m] += scale

        # Release every running job that does not stay on its model, then place the granted.
        leaving: dict[int, JobState] = {}
        for jid, js in movable.items():
            i = index.get(jid)
            if i is None or assigned.get(i) != _model_index(cluster, js.allocation):
                work.release(js.allocation, js.job.request)  # type: ignore[arg-type]
                leaving[jid] = js
        placed: dict[int, tuple[Allocation, int]] = {}
        tried: set[tuple[Request, int]] = set()
        grants = [(i, m) for i, m in pairs if assigned.get(i) == m]
        todo = [(i, m) for i, m in grants
                if jobs[i].id not in snap.running or jobs[i].id in leaving]
        self._place_pairs(snap, work, jobs, todo, placed, tried)
        # Fill: jobs whose grant did not place, or that got none, try their other models.
        rest = [(i, m) for i, m in pairs if i not in placed and
                (jobs[i].id not in snap.running or jobs[i].id in leaving)]
        self._place_pairs(snap, work, jobs, rest, placed, tried)

        starts, moves = [], []
        for i, (alloc, m) in placed.items():
            js = jobs[i]
            if js.id in leaving:
                del leaving[js.id]
                if alloc is not js.allocation:
                    moves.append((js, alloc, m))
            else:
                starts.append(Start(js.id, alloc, self._why(js, m, "lease on"), models[m]))
        for js in leaving.values():
            # Nobody took its GPUs: let it run on rather than leave them idle for a round.
            if _fits(work, js.allocation, js.job.request):  # type: ignore[arg-type]
                work.allocate(js.allocation, js.job.request)  # type: ignore[arg-type]
                continue
            old = models[_model_index(cluster, js.allocation)]
            why = ("outside Gavel's active window" if js.id not in index else
                   "other jobs have higher Gavel priority this round")
            d.preempts.append(Preempt(js.id, f"Gavel: lease on {old} ended; {why}",
                                          checkpoint=True))
        d.starts.extend(starts)
        self._order_moves(cluster, moves, d)
        self._explain_waiting(jobs, placed, snap, d)

    def _fill(self, snap: Snapshot, work: ClusterState, jobs: list[JobState],
              pairs: list[tuple[int, int]], d: Decisions, tried: set) -> None:
        """Mid-round: start waiting jobs on free GPUs, by priority, without moving anyone."""
        placed: dict[int, tuple[Allocation, int]] = {}
        self._place_pairs(snap, work, jobs, pairs, placed, tried)
        for i, (alloc, m) in placed.items():
            js = jobs[i]
            d.starts.append(Start(js.id, alloc, self._why(js, m, "mid-round lease on"),
                                  self._models[m]))
        self._explain_waiting(jobs, placed, snap, d)

    def _place_pairs(self, snap: Snapshot, work: ClusterState, jobs: list[JobState],
                     pairs: list[tuple[int, int]], placed: dict, tried: set) -> None:
        pcfg, cluster = snap.config.placement, snap.cluster
        for i, m in pairs:
            if i in placed:
                continue
            js = jobs[i]
            req = js.job.request
            old = js.allocation if js.id in snap.running else None
            if old is not None and _model_index(cluster, old) == m and _fits(work, old, req):
                # Back on the model it just left and its GPUs are still free: no migration.
                work.allocate(old, req)
                placed[i] = (old, m)
                continue
            if (req, m) in tried:  # the state only fills up: a shape that failed stays failed
                continue
            alloc = place(work, req, pcfg, models=(self._models[m],))
            if alloc is None:
                tried.add((req, m))
                continue
            work.allocate(alloc, req)
            placed[i] = (alloc, m)

    def _order_moves(self, cluster: Cluster, moves: list, d: Decisions) -> None:
        """Emit moves so that the owner, applying resizes one by one (release the old GPUs,
        allocate the new), never allocates a GPU another mover still holds. A cycle of moves
        (two jobs swapping models) is broken by preempting one of them and starting it again
        on its new GPUs after the resizes; that costs it its unsaved work."""
        holders: dict[int, set[int]] = {}  # GPU -> movers on it now (fractions share GPUs)
        for k, (js, _, _) in enumerate(moves):
            for s in js.allocation.slots:
                for g in s.gpus:
                    holders.setdefault(g, set()).add(k)
        deps = [set().union(*(holders.get(g, ()) for s in alloc.slots for g in s.gpus)) - {k}
                for k, (_, alloc, _) in enumerate(moves)]
        done: set[int] = set()
        left = list(range(len(moves)))
        while left:
            ready = [k for k in left if deps[k] <= done]
            if not ready:
                # Walk blocked-by edges from any blocked move until one repeats: that closes a
                # cycle. Break it (not a move merely waiting behind it) at the member with the
                # least unsaved work, which loses least.
                path, k = [], left[0]
                while k not in path:
                    path.append(k)
                    k = min(deps[k] - done)
                cycle = path[path.index(k):]
                k = min(cycle, key=lambda c: (moves[c][0].unsaved, moves[c][0].id))
                js, alloc, m = moves[k]
                d.preempts.append(Preempt(js.id, "Gavel: restarts on its new lease "
                                          f"({self._models[m]}) after a swap", checkpoint=True))
                d.starts.append(Start(js.id, alloc, self._why(js, m, "lease moves to"),
                                      self._models[m]))
                ready = [k]
            else:
                for k in ready:
                    js, alloc, m = moves[k]
                    d.resizes.append(Resize(js.id, alloc, self._why(js, m, "lease moves to"),
                                            self._models[m]))
            done.update(ready)
            left = [k for k in left if k not in done]

    def _explain_waiting(self, jobs: list[JobState], placed: dict, snap: Snapshot,
                         d: Decisions) -> None:
        for i, js in enumerate(jobs):
            if i not in placed and js.id not in snap.running:
                d.waiting[js.id] = ("Gavel: waiting for a lease; allocation "
                                    + self._describe(js.id))

    def _pinned(self, js: JobState, now: float, snap: Snapshot) -> bool:
        """Whether a running job keeps its GPUs this round whatever the priorities say."""
        cfg = snap.config
        if not js.job.preemptible:
            return True
        return self.use_min_runtime and not can_preempt(js, now, cfg)

    def _describe(self, jid: int) -> str:
        X, got = self._X[jid], self.received_share(jid)
        return ", ".join(f"{m} {x:.2f} (had {g:.2f})"
                         for m, x, g in zip(self._models, X, got) if x > _X_MIN)

    def _why(self, js: JobState, m: int, what: str) -> str:
        return f"Gavel: {what} {self._models[m]}; allocation {self._describe(js.id)}"


def throughput_matrix(jobs: list[JobState], models: tuple[str, ...]) -> np.ndarray:
    """T[j, m] = speed of job j's type on one GPU of model m, looked up once per type."""
    types = [js.job.job_type or job_type_for(js.id) for js in jobs]
    names = sorted(set(types))
    rows = np.array([[speed(t, m) for m in models] for t in names]).reshape(len(names),
                                                                             len(models))
    ids = {t: k for k, t in enumerate(names)}
    return rows[[ids[t] for t in types]] if jobs else np.zeros((0, len(models)))


def _busy(snap: Snapshot, d: Decisions) -> bool:
    """Whether anything runs after these decisions. On an idle cluster every waiting job has
    just been tried and failed, and time alone changes nothing, so a policy should not ask to
    be woken (the owner then reports the jobs as stuck instead of looping)."""
    return bool(d.starts or len(snap.running) > len(d.preempts))


def _model_index(cluster: Cluster, alloc: Allocation | None) -> int:
    """Index into cluster.models of the GPUs an allocation holds; -1 for none."""
    if alloc is None or not alloc.slots or not alloc.slots[0].gpus:
        return -1
    return int(cluster.node_model_id[alloc.slots[0].node])


def _fits(work: ClusterState, alloc: Allocation, req: Request) -> bool:
    """Whether `alloc`'s exact GPUs, CPU and memory are still free in `work`."""
    milli: dict[int, int] = {}
    mem: dict[int, int] = {}
    nodes: dict[int, int] = {}
    for s in alloc.slots:
        nodes[s.node] = nodes.get(s.node, 0) + 1
        for g in s.gpus:
            milli[g] = milli.get(g, 0) + s.milli
            mem[g] = mem.get(g, 0) + s.gpu_memory_mib
    return (all(work.gpu_free_milli[g] >= v for g, v in milli.items())
            and all(work.gpu_free_mem[g] >= v for g, v in mem.items())
            and all(work.node_free_cpu[n] >= k * req.cpus_milli
                    and work.node_free_mem[n] >= k * req.memory_mib for n, k in nodes.items()))


__all__ = ["Gavel", "throughput_matrix"]

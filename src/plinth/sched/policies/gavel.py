"""Gavel: heterogeneity-aware max-min fairness with round-based leases (Narayanan et al.,
OSDI'20).

Two layers, as in the paper:

1. An allocation. For the active jobs, `plinth.sched.lp.max_min_fairness` picks time fractions
   X[j, m] on each GPU model m that maximise the smallest normalised throughput (throughput over
   what the job would get from an equal 1/N share of the cluster). Throughputs come from the
   snapshot's `config.throughputs` (`plinth.core.throughput.Throughputs`). The LP is solved
   again only when the active jobs have changed, and then at the next round boundary (at most
   once per round).
2. A round-based mechanism that realises X over time. At each round boundary (every
   `config.round_s`, 6 minutes by default, Gavel's `time_per_iteration`) every (job, model) pair
   gets priority X[j, m] / (share of its active time the job has run on m so far); a pair never
   run gets infinite priority. Ties go to the job already on the model, then to the job furthest
   behind its allocation (its deficit, Gavel's own tie-break), then to the larger X, the faster
   model, the older job. Pairs are granted greedily by priority while the model has GPUs
   left. Jobs that keep their model keep their GPUs (no migration); jobs granted another model
   are moved (`Resize`); running jobs granted nothing are preempted, unless their GPUs stay idle
   anyway, in which case they keep running. Between boundaries, passes only start waiting jobs
   on free GPUs; nobody is moved or preempted before the round ends. With `round_s = 0`
   ("rounds off") every pass is a boundary: the allocation and the leases are recomputed at
   every event (an arrival, a completion) and nothing waits for a round to end.

Choices and simplifications, each for a reason:

- The active set is the `max_jobs` oldest jobs (running and pending, by submit time), so the LP
  stays small on large queues. Later jobs wait with "outside Gavel's active window".
- Jobs of one class (same job type, gang size and allowed models) are interchangeable in the
  LP, which is solved over classes (see `plinth.sched.lp`): every member gets the class's
  allocation, and the LP only changes when the number of active jobs in some class does. A job
  that joins an existing class between solves takes that class's allocation; a job of a new
  class takes an even split over the models it can use until the next solve, which with its
  infinite priority (never run) puts it first, fastest model first.
- Scale factors: a gang counts as `request.num_gpus` GPUs, fractional shares as their fraction.
  The LP ignores locality; placement still consolidates gangs on one model.
- Gavel's lease is the job's guarantee, so SchedConfig's min_runtime and preemption backoff
  (meant for priority preemption) are not applied unless `use_min_runtime=True`; jobs marked
  not preemptible are never moved or preempted and hold their GPUs in the count.
- A job checkpoints when its lease ends (`Preempt(checkpoint=True)`), as Gavel assumes, so
  rotating jobs every round loses no work.
- Resizes are emitted in an order where no move needs GPUs another mover still holds, so an
  owner applying them one at a time never over-commits. A swap (a cycle) cannot be ordered:
  the member with the least unsaved work is preempted and started again after the resizes.
- Jobs that need no GPU are started wherever they fit and never preempted.
- Bookkeeping (time active, time received per model) lives in this object between calls, in
  numpy arrays with one row per active job, and is updated from the snapshot: a running job is
  charged for the time since the previous call on the model its allocation is on. A job that
  leaves the active set loses its history.
- Reasons: every waiting job's reason is given at each round boundary, where leases are
  decided; between boundaries only newcomers get one (the others' has not changed).
"""

from __future__ import annotations

import math
from itertools import islice, repeat
from operator import attrgetter

import numpy as np

from plinth.core.errors import SpecError
from plinth.core.resources import Allocation, Cluster
from plinth.core.throughput import DEFAULT_THROUGHPUTS, Throughputs
from plinth.sched.lp import feasible_mask, max_min_fairness
from plinth.sched.placement import place
from plinth.sched.policies.base import Policy
from plinth.sched.policies.gavel_book import GavelBook, model_index, throughput_matrix
from plinth.sched.preemption import can_preempt
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, Resize, Snapshot, Start

_X_MIN = 1e-4  # time fractions below this are solver noise, not an allocation
_NO_ROOM = "Gavel: no GPU model it may use has room for the gang"
_ID = attrgetter("id")


class Gavel(Policy):
    """Gavel: heterogeneity-aware max-min fairness (HiGHS LP) with round-based leases."""

    name = "gavel"
    preemptive = True
    requires = frozenset({"checkpoint", "relaunch"})
    round_based = True  # leases last `config.round_s` (0: re-decided at every event)

    def __init__(self, *, max_jobs: int = 1000, use_min_runtime: bool = False) -> None:
        if max_jobs < 1:
            raise SpecError(f"gavel.max_jobs: must be at least 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self.use_min_runtime = use_min_runtime
        self._cluster: Cluster | None = None
        self._thr: Throughputs = DEFAULT_THROUGHPUTS
        self._reset(())

    def _reset(self, models: tuple[str, ...]) -> None:
        self._models = models
        self._book = GavelBook(len(models))
        self._cap = np.zeros(len(models))
        # LP classes: (job type, gang, allowed models) -> id, with their per-model arrays.
        self._class_of: dict[tuple, int] = {}
        self._cT = np.zeros((0, len(models)))  # speed per model
        self._cscale = np.zeros(0)
        self._cfrac = np.zeros(0, dtype=bool)  # asks for a fraction of a GPU
        self._callowed = np.zeros((0, len(models)), dtype=bool)
        self._cX: np.ndarray = np.zeros((0, len(models)))  # the last solve's X per class
        self._cin = np.zeros(0, dtype=bool)  # class was in the last solve
        self._lp_counts: np.ndarray | None = None
        self.fairness = 0.0  # the LP's t, for reports
        self._prev_rows = np.zeros(0, dtype=np.intp)
        self._run_rows = np.zeros(0, dtype=np.intp)  # rows of the jobs running, and where
        self._run_m = np.zeros(0, dtype=np.intp)
        self._last_run: list[JobState] = []
        self._last_allocs: list[Allocation | None] = []
        self._run_unbooked = False  # a running job had no row (outside the window)
        self._run_where: dict[int, tuple] = {}  # job id -> (allocation, row, model index)
        self._last_now: float | None = None
        self._round_end = -math.inf
        self._outside_why = f"outside Gavel's active window (the {self.max_jobs} oldest jobs)"

    # -- bookkeeping -------------------------------------------------------------------------
    def allocation(self, job_id: int) -> np.ndarray | None:
        """The job's current time fractions per model (cluster.models order), if active."""
        r = self._book.row.get(job_id)
        return None if r is None or not self._book.has_x[r] else self._book.X[r].copy()

    def received_share(self, job_id: int) -> np.ndarray:
        """The share of its active time the job has run on each model so far."""
        b = self._book
        r = b.row.get(job_id)
        if r is None or b.active[r] <= 0:
            return np.zeros(len(self._models))
        return b.recv[r] / b.active[r]

    def _sync(self, snap: Snapshot) -> None:
        """Start from scratch on a new cluster or throughput matrix."""
        cluster, thr = snap.cluster, snap.config.throughputs
        if cluster is self._cluster and thr is self._thr:
            return
        if self._cluster is None or self._models != cluster.models or thr is not self._thr:
            self._reset(cluster.models)
        self._cluster, self._thr = cluster, thr
        self._cap = np.array([cluster.gpus_of_model(m) for m in self._models], dtype=float)

    def _class(self, js: JobState) -> int:
        req = js.job.request
        if req.gpu_milli_total == 0:
            return -1
        jtype = self._thr.type_of(js.job)
        key = (jtype, req.num_gpus, req.gpu_models)
        c = self._class_of.get(key)
        if c is None:
            c = self._class_of[key] = len(self._class_of)
            models = self._models
            self._cT = np.vstack([self._cT, self._thr.speeds(jtype, models)])
            self._cscale = np.append(self._cscale, req.num_gpus)
            self._cfrac = np.append(self._cfrac, req.fractional)
            self._callowed = np.vstack([self._callowed, [req.allows(m) for m in models]])
            self._cX = np.vstack([self._cX, np.zeros(len(models))])
            self._cin = np.append(self._cin, False)
        return c

    def _rows(self, window: list[JobState]) -> tuple[np.ndarray, list[int]]:
        """Rows of the window's jobs (added on first sight) and the indices of the new ones."""
        # C-level loops: the window holds up to `max_jobs` jobs in every pass.
        rows = list(map(self._book.row.get, map(_ID, window), repeat(-1)))
        fresh = [i for i, r in enumerate(rows) if r < 0] if -1 in rows else []
        for i in fresh:
            js = window[i]
            rows[i] = self._book.add(js, self._class(js))
        return np.array(rows, dtype=np.intp), fresh

    def _account(self, snap: Snapshot, now: float, run: list[JobState], fresh: bool) -> None:
        """Charge the time since the last pass: active time to the jobs active then, time on a
        model to the jobs running now (they have run since the last pass's decisions)."""
        b = self._book
        allocs = [js.allocation for js in run]
        if (fresh and self._run_unbooked) or run != self._last_run or allocs != self._last_allocs:
            # Who runs where changed (identity checks: a pass often changes nothing here).
            b.run_m[self._run_rows] = -1
            get, node_model = b.row.get, snap.cluster.node_model_list
            where = self._run_where
            rows, models = [], []
            unbooked = False
            for js, a in zip(run, allocs):
                r = get(js.id)
                if r is None:
                    unbooked = True  # outside the window: not accounted
                    continue
                known = where.get(js.id)
                if known is not None and known[0] is a and known[1] == r:
                    m = known[2]
                elif a is not None and a.slots and a.slots[0].gpus:
                    m = node_model[a.slots[0].node]
                    where[js.id] = (a, r, m)
                else:
                    continue
                rows.append(r)
                models.append(m)
            if len(where) > 2 * len(run) + 64:
                for jid in [j for j in where if j not in snap.running]:
                    del where[jid]
            self._run_rows = np.array(rows, dtype=np.intp)
            self._run_m = np.array(models, dtype=np.intp)
            b.run_m[self._run_rows] = self._run_m
            self._last_run, self._last_allocs = run, allocs
            self._run_unbooked = unbooked
        run_rows, run_m = self._run_rows, self._run_m
        dt = 0.0 if self._last_now is None else now - self._last_now
        self._last_now = now
        if dt > 0:
            b.active[self._prev_rows] += dt
            b.recv[run_rows, run_m] += dt

    def _forget(self, keep: set[int]) -> None:
        """Drop the history of jobs that left the active set and are not running."""
        b = self._book
        for jid in [j for j in b.row if j not in keep]:
            b.drop(jid)

    def _solve(self, rows: np.ndarray) -> None:
        """Solve the LP over the active classes if their counts changed since the last solve,
        then give every active job its class's allocation."""
        b = self._book
        counts = np.bincount(b.cls[rows], minlength=len(self._class_of)).astype(float)
        if self._lp_counts is None or not np.array_equal(counts, self._lp_counts):
            live = np.flatnonzero(counts)
            res = max_min_fairness(self._cT[live], self._cscale[live], self._cap,
                                   allowed=self._callowed[live], counts=counts[live])
            self._cX[:] = 0.0
            self._cX[live] = res.X
            self._cin[:] = False
            self._cin[live] = True
            self.fairness = res.t
            self._lp_counts = counts
        b.X[rows] = self._cX[b.cls[rows]]
        b.has_x[rows] = True

    def _provisional(self, rows: np.ndarray) -> None:
        """Jobs without an allocation yet: their class's from the last solve if the class was
        in it, else an even split over the models they can use."""
        b = self._book
        new = rows[~b.has_x[rows]]
        if not new.size:
            return
        cls = b.cls[new]
        ok = feasible_mask(self._cT[cls], self._cscale[cls], self._cap, self._callowed[cls])
        even = ok / np.maximum(1, ok.sum(axis=1, keepdims=True))
        b.X[new] = np.where(self._cin[cls, None], self._cX[cls], even)
        b.has_x[new] = True

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        self._sync(snap)
        cfg, b = snap.config, self._book
        run = list(snap.running.values())
        window, outside = self._window(snap, run)
        why_out = self._outside_why
        for js in outside:  # new to the outside; all of them again at a round boundary
            if js.reason is not why_out:
                d.waiting[js.id] = why_out
        rows, fresh = self._rows(window)
        self._account(snap, now, run, bool(fresh))
        boundary = cfg.round_s <= 0 or now >= self._round_end - 1e-9
        if boundary:
            for js in outside:
                d.waiting[js.id] = why_out
        gpu = b.cls[rows] >= 0
        grows = rows[gpu]
        if boundary:
            self._forget({js.id for js in window} | set(snap.running))
            self._solve(grows)
        elif fresh:
            self._provisional(grows)
        self._prev_rows = grows
        if boundary and len(window) == len(run) and len(self._models) == 1:
            # Nobody waits in the window and there is no other model to move to: every lease
            # is renewed, so the round changes nothing (the common case in a trace's tail).
            self._round_end = now + cfg.round_s
            d.wake_at = self._round_end if cfg.round_s > 0 and run else None
            return d
        usable = b.X[grows].sum(axis=1) > _X_MIN
        gidx = np.flatnonzero(gpu)
        for k in np.flatnonzero(~usable).tolist():
            js = window[gidx[k]]
            if js.id not in snap.running and (boundary or js.reason is not _NO_ROOM):
                d.waiting[js.id] = _NO_ROOM
        jpos = gidx[usable]
        jobs = list(map(window.__getitem__, jpos.tolist()))
        jrows = grows[usable]

        work: ClusterState | None = None
        if boundary:
            work = snap.state.copy()
            ji, mi = self._pairs(jrows)
            self._round_end = now + cfg.round_s
            self._new_round(snap, now, work, jobs, jrows, ji, mi, d)
        else:
            # Mid-round only waiting jobs may start, and only on free GPUs.
            placed: dict[int, tuple[Allocation, int]] = {}
            state = snap.state
            if state.free_milli > 0:
                # Only the waiting jobs that could fit what is free need ranking.
                scale = self._cscale[b.cls[jrows]]
                whole = scale >= 1
                fits = ~whole | (scale <= state.whole_free_gpus())
                wait = np.flatnonzero((b.run_m[jrows] < 0) & fits)
                if wait.size:
                    work = snap.state.copy()
                    ji, mi = self._pairs(jrows[wait])
                    placed = self._fill(snap, work, jobs, jrows, wait[ji], mi, d)
            if fresh:
                # Reasons for the newcomers; the others keep the one their round gave them.
                where = np.full(len(window), -1)
                where[jpos] = np.arange(jpos.size)
                new = where[fresh]
                self._explain_waiting(jobs, jrows, new[new >= 0].tolist(), placed, d)
        # Jobs that need no GPU never compete for the LP's resources.
        for i in np.flatnonzero(~gpu).tolist():
            js = window[i]
            if js.id not in snap.running:
                if work is None:
                    work = snap.state.copy()
                alloc = place(work, js.job.request, cfg.placement)
                if alloc is not None:
                    work.allocate(alloc, js.job.request)
                    d.starts.append(Start(js.id, alloc, "Gavel: needs no GPU, fits now"))
                else:
                    d.waiting[js.id] = "Resources: no node has the CPU or memory free"
        busy = cfg.round_s > 0 and _busy(snap, d)
        d.wake_at = self._round_end if busy else None
        return d

    def _window(self, snap: Snapshot, run: list[JobState]
                ) -> tuple[list[JobState], list[JobState]]:
        """The `max_jobs` oldest jobs, running or pending (in no particular order), and the
        pending jobs examined after them."""
        head = list(islice(snap.pending, self.max_jobs + snap.config.backfill_depth))
        room = self.max_jobs - len(run)
        order = self.order
        # Pending is sorted by age; usually every running job is older than the first pending
        # job left out, and the window is simply all running jobs plus the oldest pending.
        if room >= 0 and (len(head) <= room or not run
                          or max(map(order, run)) < order(head[room])):
            return run + head[:room], head[room:]
        jobs = sorted(head + run, key=order)
        return jobs[:self.max_jobs], [js for js in jobs[self.max_jobs:]
                                      if js.id not in snap.running]

    def _pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(job index, model index) pairs with X > 0, highest Gavel priority first."""
        b = self._book
        X = b.X[rows]
        active = b.active[rows, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(active > 0, b.recv[rows] / active, 0.0)
            prio = np.where(share > 0, X / share, np.inf)
        ji, mi = np.nonzero(X > _X_MIN)
        if not ji.size:
            return ji, mi
        r = rows[ji]
        stay = b.run_m[r] == mi
        T = self._cT[b.cls[r], mi]
        # A job's deficit: the share of its active time it should have run so far, less the
        # share it has (Gavel breaks ties by deficit too).
        deficit = (X.sum(axis=1) - share.sum(axis=1))[ji]
        # Ties (e.g. every pair never run) go to the job already there (no migration), then
        # the job furthest behind, then the larger allocation, then the faster model, then
        # the older job. Rounding keeps solver noise from deciding.
        order = np.lexsort((b.jid[r], b.submit[r], -T, -np.round(X[ji, mi], 6),
                            -np.round(deficit, 6), ~stay, -np.round(prio[ji, mi], 6)))
        return ji[order], mi[order]

    def _new_round(self, snap: Snapshot, now: float, work: ClusterState, jobs: list[JobState],
                   rows: np.ndarray, ji: np.ndarray, mi: np.ndarray, d: Decisions) -> None:
        cluster, models, b = snap.cluster, self._models, self._book
        cap = self._cap.tolist()
        used = [0.0] * len(models)
        on = b.run_m[rows].tolist()  # the model each job runs on, -1 if waiting
        index = {jobs[i].id: i for i, m in enumerate(on) if m >= 0}
        assigned: dict[int, int] = {}  # job index -> model index
        movable: dict[int, tuple[JobState, int]] = {}  # with the model it is on
        for js in snap.running.values():
            i = index.get(js.id)
            m = on[i] if i is not None else model_index(cluster, js.allocation)
            if m < 0:
                continue
            if self._pinned(js, now, snap):
                used[m] += js.job.request.num_gpus
                if i is not None:
                    assigned[i] = m
            else:
                movable[js.id] = (js, m)
        # Grant pairs by priority while the model has GPUs left (a count; placement below
        # may still fail on fragmentation, and the fill pass then tries the job's other models).
        cls = b.cls[rows]
        scale = self._cscale[cls].tolist()
        smallest = min(scale, default=0.0)
        full = [u + smallest > c + 1e-9 for u, c in zip(used, cap)]
        n_full = sum(full)
        pairs = list(zip(ji.tolist(), mi.tolist()))
        for i, m in pairs:
            if full[m] or i in assigned:
                continue
            s = scale[i]
            if used[m] + s <= cap[m] + 1e-9:
                assigned[i] = m
                used[m] += s
                if used[m] + smallest > cap[m] + 1e-9:
                    full[m] = True
                    n_full += 1
                    if n_full == len(models):
                        break  # no model can take even the smallest job

        # Release every running job that does not stay on its model, then place the granted.
        leaving: dict[int, JobState] = {}
        free = [m < 0 for m in on]  # waiting, or leaving its GPUs: to be placed
        for jid, (js, m) in movable.items():
            i = index.get(jid)
            if i is None or assigned.get(i) != m:
                work.release(js.allocation, js.job.request)  # type: ignore[arg-type]
                leaving[jid] = js
                if i is not None:
                    free[i] = True
        placed: dict[int, tuple[Allocation, int]] = {}
        tried: set[tuple[int, int]] = set()
        frac = self._cfrac[cls].tolist()
        todo = [(i, m) for i, m in pairs if free[i] and assigned.get(i) == m]
        self._place_pairs(snap, work, jobs, todo, placed, tried, scale, frac, on)
        # Fill: jobs whose grant did not place, or that got none, try their other models.
        rest = [(i, m) for i, m in pairs if free[i] and i not in placed]
        self._place_pairs(snap, work, jobs, rest, placed, tried, scale, frac, on)

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
            if work.fits(js.allocation, js.job.request):  # type: ignore[arg-type]
                work.allocate(js.allocation, js.job.request)  # type: ignore[arg-type]
                continue
            old = models[model_index(cluster, js.allocation)]
            why = ("outside Gavel's active window" if js.id not in index else
                   "other jobs have higher Gavel priority this round")
            d.preempts.append(Preempt(js.id, f"Gavel: lease on {old} ended; {why}",
                                      checkpoint=True))
        d.starts.extend(starts)
        self._order_moves(cluster, moves, d)
        self._explain_waiting(jobs, rows, list(range(len(jobs))), placed, d)

    def _fill(self, snap: Snapshot, work: ClusterState, jobs: list[JobState], rows: np.ndarray,
              ji: np.ndarray, mi: np.ndarray, d: Decisions) -> dict:
        """Mid-round: start waiting jobs on free GPUs, by priority, without moving anyone."""
        placed: dict[int, tuple[Allocation, int]] = {}
        cls = self._book.cls[rows]
        self._place_pairs(snap, work, jobs, list(zip(ji.tolist(), mi.tolist())), placed, set(),
                          self._cscale[cls].tolist(), self._cfrac[cls].tolist(),
                          self._book.run_m[rows].tolist())
        for i, (alloc, m) in placed.items():
            js = jobs[i]
            d.starts.append(Start(js.id, alloc, self._why(js, m, "mid-round lease on"),
                                  self._models[m]))
        return placed

    def _place_pairs(self, snap: Snapshot, work: ClusterState, jobs: list[JobState],
                     pairs: list[tuple[int, int]], placed: dict, tried: set,
                     scale: list[float], frac: list[bool], on: list[int]) -> None:
        """Place `pairs` in order (a job at most once). `scale`, `frac` and `on` give each
        job's GPUs, whether it asks for a fraction, and the model it runs on (-1: none)."""
        pcfg = snap.config.placement
        free, whole = work.free_milli, work.free_whole_by_model.tolist()
        for i, m in pairs:
            if i in placed:
                continue
            if free <= 0:
                break  # every GPU is taken: nothing more can be placed
            if not frac[i] and whole[m] < scale[i]:
                continue
            req = jobs[i].job.request
            if on[i] == m:
                old = jobs[i].allocation
                if work.fits(old, req):  # type: ignore[arg-type]
                    # Back on the model it just left and its GPUs are still free: no move.
                    work.allocate(old, req)  # type: ignore[arg-type]
                    placed[i] = (old, m)
                    free, whole = work.free_milli, work.free_whole_by_model.tolist()
                    continue
            key = (id(req), m)  # the state only fills up: a shape that failed stays failed
            if key in tried:
                continue
            alloc = place(work, req, pcfg, models=(self._models[m],))
            if alloc is None:
                tried.add(key)
                continue
            work.allocate(alloc, req)
            placed[i] = (alloc, m)
            free, whole = work.free_milli, work.free_whole_by_model.tolist()

    def _order_moves(self, cluster: Cluster, moves: list, d: Decisions) -> None:
        """Emit moves so that an owner applying resizes one by one (release the old GPUs,
        allocate the new) never allocates a GPU another mover still holds. A cycle of moves
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

    def _explain_waiting(self, jobs: list[JobState], rows: np.ndarray, idx: list[int],
                         placed: dict, d: Decisions) -> None:
        """Reasons for the jobs `idx` left waiting; the text is rebuilt only when its rounded
        numbers change."""
        b = self._book
        if not idx:
            return
        cand = np.array(idx, dtype=np.intp)
        cand = cand[b.run_m[rows[cand]] < 0].tolist()
        wait = [i for i in cand if i not in placed] if placed else cand
        if not wait:
            return
        r = rows[wait]
        active = b.active[r, None]
        share = np.divide(b.recv[r], active, out=np.zeros_like(b.recv[r]), where=active > 0)
        key = np.round(np.hstack([b.X[r], share]) * 100).astype(np.int64)
        old = b.why_key[r]
        stale = (key != old).any(axis=1)
        b.why_key[r] = key
        for k, i in enumerate(wait):
            row = int(r[k])
            if stale[k] or b.why[row] is None:
                b.why[row] = "Gavel: waiting for a lease; allocation " + self._alloc_text(row)
            d.waiting[jobs[i].id] = b.why[row]  # type: ignore[assignment]

    def _pinned(self, js: JobState, now: float, snap: Snapshot) -> bool:
        """Whether a running job keeps its GPUs this round whatever the priorities say."""
        if not js.job.preemptible:
            return True
        return self.use_min_runtime and not can_preempt(js, now, snap.config)

    def _alloc_text(self, r: int) -> str:
        """Row r's allocation per model, with the share of its active time it had there."""
        b = self._book
        xs, active = b.X[r].tolist(), float(b.active[r])
        got = (b.recv[r] / active).tolist() if active > 0 else [0.0] * len(xs)
        return ", ".join(f"{m} {x:.2f} (had {g:.2f})"
                         for m, x, g in zip(self._models, xs, got) if x > _X_MIN)

    def _describe(self, jid: int) -> str:
        r = self._book.row.get(jid)
        return "none yet" if r is None or not self._book.has_x[r] else self._alloc_text(r)

    def _why(self, js: JobState, m: int, what: str) -> str:
        return f"Gavel: {what} {self._models[m]}; allocation {self._describe(js.id)}"


def _busy(snap: Snapshot, d: Decisions) -> bool:
    """Whether anything runs after these decisions. On an idle cluster every waiting job has
    just been tried and failed, and time alone changes nothing, so a policy should not ask to
    be woken (the owner then reports the jobs as stuck instead of looping)."""
    return bool(d.starts or len(snap.running) > len(d.preempts))


__all__ = ["Gavel", "throughput_matrix"]

"""Multi-tenant fair share: Kueue-style quotas in a cohort, admission ordered by DRF.

Each tenant is a Kueue ClusterQueue: nominal GPUs it is guaranteed, an optional borrowing
limit, a cohort and a weight (`TenantQuota`, see `plinth.sched.quota` for the borrowing rule).

- Quotas come from the `quotas` option, else `cluster.tenants`. With neither, every tenant seen
  so far (pending or running) gets an equal nominal share of all GPUs with unlimited borrowing;
  the list grows as new tenants appear and is remembered, so a tenant whose queue empties keeps
  its share and a tenant that arrives late is not stuck at zero. A tenant the configured quotas
  do not name has 0 nominal GPUs in cohort "default": it only runs on quota others leave idle.
- Admission: repeatedly take the tenant with the lowest weighted dominant share (DRF over GPU,
  CPU and memory) and try its next job; as in Kueue, tenants whose next job stays within their
  nominal quota go before those whose next job would borrow. A job starts if it fits now and
  its tenant stays within nominal, or may borrow (jobs beyond nominal are "borrowing").
- Reclaim (Kueue's reclaimWithinCohort): a job that would keep its tenant within nominal but
  does not fit may preempt jobs of tenants in its cohort that are borrowing, the most-over-quota
  tenant first, each tenant's jobs in `victim_order` (lower priority, less unsaved work first).
  A tenant at or below nominal is never a victim; jobs no larger than what a tenant borrows are
  taken first, but when all its jobs are larger, one may take it below nominal (as in Kueue,
  else the reclaiming tenant could never get its guarantee). Borrowing jobs never preempt.
- `preempt_within_tenant` (off by default): a job may also preempt lower-priority jobs of its
  own tenant, to make room or to free the tenant's own quota (Kueue's withinClusterQueue).

The pending queue is kept grouped by tenant (see `order`), so a pass finds each tenant's jobs
by binary search and stops reading a tenant once `depth` of its jobs wait for distinct reasons
(or `backfill_depth` wait in all): its work is O(depth x tenants + starts + running), plus a
cheap look-up per repeated blocked job, not O(pending). Jobs further back are not examined and
get no new reason.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence

from plinth.core.resources import MILLI, Allocation, Cluster, Request, TenantQuota
from plinth.sched.placement import place
from plinth.sched.preemption import (_prune, can_preempt, find_victims, guaranteed_runtime,
                                     victim_order)
from plinth.sched.policies.base import Policy
from plinth.sched.quota import NO_QUOTA, NOMINAL, QuotaBook, TenantUsage, derive_quotas, gpus
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, Snapshot, Start

Victims = tuple[list[JobState], ClusterState, Allocation]

_by_priority = victim_order(lambda js: js.job.priority)
STARTED, WAITS, REPEAT = "started", "waits", "repeat"  # what `_Pass.admit` did with a job


class FairShare(Policy):
    name = "drf"
    preemptive = True

    def __init__(self, *, quotas: Sequence[TenantQuota] | None = None, depth: int = 16,
                 reclaim: bool = True, preempt_within_tenant: bool = False,
                 strict_fifo: bool = False) -> None:
        if depth < 1:
            raise ValueError(f"drf: depth must be at least 1, got {depth}")
        self.quotas = tuple(quotas) if quotas is not None else None
        self.depth = depth
        self.reclaim = reclaim
        self.preempt_within_tenant = preempt_within_tenant
        self.strict_fifo = strict_fifo  # a tenant's blocked job also blocks the ones behind it
        self._derived_for: Cluster | None = None
        self._seen: frozenset[str] = frozenset()
        self._derived: tuple[TenantQuota, ...] = ()

    def order(self, js: JobState) -> tuple:
        # Grouped by tenant so that a pass can find each tenant's first jobs by binary search;
        # within a tenant, higher priority first, then submit order (Kueue's queue order).
        return (js.job.tenant, -js.job.priority, js.job.submit_time, js.job.id)

    def quotas_for(self, cluster: Cluster, tenants: set[str]) -> tuple[TenantQuota, ...]:
        """The quotas in force; derived ones (equal shares) only when none are configured."""
        if self.quotas is not None:
            return self.quotas
        if cluster.tenants:
            return cluster.tenants
        if self._derived_for is not cluster:
            self._derived_for, self._seen, self._derived = cluster, frozenset(), ()
        if not tenants <= self._seen:
            self._seen = self._seen | tenants
            self._derived = derive_quotas(cluster, self._seen)
        return self._derived

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        queues = tenant_queues(snap.pending)
        tenants = set(queues) | {js.job.tenant for js in snap.running.values()}
        book = QuotaBook(self.quotas_for(snap.cluster, tenants), snap.cluster)
        for js in snap.running.values():
            book.charge(js.job.tenant, js.job.request)
        p = _Pass(self, snap, now, book)
        p.run(queues)
        return p.d


def tenant_queues(pending: Sequence[JobState], check: int = 16
                  ) -> dict[str, Sequence[JobState]]:
    """Each tenant's pending jobs in queue order, as views into `pending` (no copies).

    `pending` is sorted by the policy's order, so grouped by tenant, and each group's end is
    found by binary search. A queue caught not grouped (say, kept in submit order) is split
    by a full scan instead: the first `check` jobs of each group must be the group's tenant,
    and a group that ends sooner must end where the search says.
    """
    queues: dict[str, Sequence[JobState]] = {}
    n, i, last = len(pending), 0, None
    while i < n:
        t = pending[i].job.tenant
        if last is not None and t <= last:
            return _scan_queues(pending)
        j = i
        while j < n and j - i < check and pending[j].job.tenant == t:
            j += 1
        lo, hi = j, n
        while lo < hi:  # first index past tenant t
            mid = (lo + hi) // 2
            if pending[mid].job.tenant <= t:
                lo = mid + 1
            else:
                hi = mid
        if lo > j and (j - i < check or pending[lo - 1].job.tenant != t):
            return _scan_queues(pending)
        queues[t] = _View(pending, i, lo)
        i, last = lo, t
    return queues


def _scan_queues(pending: Sequence[JobState]) -> dict[str, Sequence[JobState]]:
    queues: dict[str, list[JobState]] = {}
    for js in pending:
        queues.setdefault(js.job.tenant, []).append(js)
    return queues  # type: ignore[return-value]


class _View(Sequence):
    """pending[lo:hi] without copying (the queue may be a large sorted container)."""

    __slots__ = ("seq", "lo", "hi")

    def __init__(self, seq: Sequence[JobState], lo: int, hi: int) -> None:
        self.seq, self.lo, self.hi = seq, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self.seq[self.lo + x] for x in range(*k.indices(len(self)))]
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self.seq[self.lo + k]


class _Donor:
    """A borrowing tenant's preemptible jobs, handed out as reclaim victims. Jobs no larger
    than what it still borrows come first, so reclaim tries not to push it below nominal."""

    __slots__ = ("tenant", "left", "jobs", "pos", "deferred", "dpos")

    def __init__(self, tenant: TenantUsage, jobs: list[JobState]) -> None:
        self.tenant, self.left, self.jobs, self.pos = tenant, tenant.gpu - tenant.nominal, jobs, 0
        self.deferred: list[JobState] = []  # too large when seen; `left` only shrinks after
        self.dpos = 0

    def next(self) -> JobState | None:
        while self.pos < len(self.jobs):
            js = self.jobs[self.pos]
            self.pos += 1
            if js.job.request.gpu_milli_total <= self.left:
                return js
            self.deferred.append(js)
        if self.dpos < len(self.deferred):
            self.dpos += 1
            return self.deferred[self.dpos - 1]
        return None


class _Pass:
    """One scheduling pass: the working state, the quota book and the decisions so far."""

    def __init__(self, policy: FairShare, snap: Snapshot, now: float, book: QuotaBook) -> None:
        self.policy, self.snap, self.now, self.book = policy, snap, now, book
        self.cfg = snap.config
        self.work = snap.state.copy()
        self.d = Decisions()
        self.preempted: set[int] = set()
        self.failed: dict[tuple, str] = {}  # preemption searches that failed in this pass
        self.blocked: dict[tuple, tuple[int, str]] = {}  # see `admit`
        self._running: dict[str, list[JobState]] | None = None

    def run(self, queues: dict[str, Sequence[JobState]]) -> None:
        book, depth, scan = self.book, self.policy.depth, max(self.cfg.backfill_depth, 1)
        cursor = dict.fromkeys(queues, 0)
        waits = dict.fromkeys(queues, 0)  # jobs that needed a placement or quota check
        seen = dict.fromkeys(queues, 0)  # all jobs examined that wait

        def key(name: str) -> tuple[bool, float, str]:
            # As Kueue orders its heads: a job within its tenant's nominal quota before any
            # that would borrow (lending first and reclaiming at once would only thrash),
            # then the lowest weighted dominant share, then the name for determinism.
            t, req = book.tenant(name), queues[name][cursor[name]].job.request
            return (t.gpu + req.gpu_milli_total > t.nominal, book.share(t), name)

        def line(names: Iterable[str]) -> list[tuple[bool, float, str]]:
            return [key(t) for t in names if cursor[t] < len(queues[t])]

        heap = line(queues)
        heapq.heapify(heap)
        while heap:
            name = heapq.heappop(heap)[-1]
            jobs, i = queues[name], cursor[name]
            cursor[name] = i + 1
            preempts = len(self.d.preempts)
            outcome = self.admit(jobs[i])
            if outcome != STARTED:
                # Jobs that start cost one placement each and are bounded by the cluster;
                # jobs that wait are bounded per tenant, so a long queue costs no more:
                # `depth` that needed real work, `backfill_depth` in all (as Slurm's
                # bf_max_job_test), so small jobs behind a run of blocked big ones still start.
                waits[name] += outcome == WAITS
                seen[name] += 1
                if self.policy.strict_fifo:
                    for js in jobs[i + 1:i + depth]:
                        self.d.waiting[js.id] = (f"Queue: behind job {jobs[i].id} of {name} "
                                                 f"(strict FIFO)")
                    cursor[name] = len(jobs)
                elif waits[name] >= depth or seen[name] >= scan:
                    cursor[name] = len(jobs)
            if len(self.d.preempts) != preempts:
                # Victims' tenants now hold less, so their place in line moved up.
                heap = line(t for t in queues if t != name)
                heapq.heapify(heap)
            if cursor[name] < len(jobs):
                heapq.heappush(heap, key(name))

    # -- one job -----------------------------------------------------------------------------
    def admit(self, js: JobState) -> str:
        """STARTED, WAITS, or REPEAT: it waits for the same reason as an identical job just
        before it (same tenant, request and priority, nothing started or preempted since),
        found without a placement, so runs of blocked look-alike jobs cost next to nothing."""
        key = (js.job.tenant, js.job.request, js.job.priority)
        version = len(self.d.starts) + len(self.d.preempts)
        hit = self.blocked.get(key)
        if hit is not None and hit[0] == version:
            self.d.waiting[js.id] = hit[1]
            return REPEAT
        if self._admit(js):
            return STARTED
        self.blocked[key] = (version, self.d.waiting[js.id])
        return WAITS

    def _admit(self, js: JobState) -> bool:
        t = self.book.tenant(js.job.tenant)
        req = js.job.request
        v = self.book.verdict(t, req.gpu_milli_total)
        if v.kind == NO_QUOTA:
            if self.policy.preempt_within_tenant and self.within_tenant(js, t):
                return True
            self.d.waiting[js.id] = v.text
            return False
        alloc = place(self.work, req, self.cfg.placement)
        if alloc is not None:
            self.start(js, t, alloc, ("Admitted: " if v.kind == NOMINAL
                                      else "Admitted (borrowing): ") + v.text)
            return True
        if v.kind == NOMINAL:
            why = self.reclaim(js, t) if self.policy.reclaim else "reclaim is off"
            if why is None:
                return True
            why = (f"{t.name} is within nominal quota ({gpus(t.gpu + req.gpu_milli_total)}/"
                   f"{gpus(t.nominal)} GPUs with this job); {why}")
        else:
            why = f"{v.text}, and a borrowing job never preempts"
        if self.policy.preempt_within_tenant and self.within_tenant(js, t):
            return True
        self.d.waiting[js.id] = f"Resources: {gpus(req.gpu_milli_total)} GPUs not free; {why}"
        return False

    def start(self, js: JobState, t: TenantUsage, alloc: Allocation, reason: str) -> None:
        self.work.allocate(alloc, js.job.request)
        self.book.charge(t.name, js.job.request)
        self.d.starts.append(Start(js.id, alloc, reason))

    def preempt(self, victims: list[JobState], reason) -> None:
        for v in victims:
            self.d.preempts.append(Preempt(v.id, reason(v)))
            self.book.charge(v.job.tenant, v.job.request, -1)
            self.preempted.add(v.id)

    # -- preemption --------------------------------------------------------------------------
    def running_of(self, tenant: str) -> list[JobState]:
        """A tenant's running jobs in victim order, built once per pass when first needed."""
        if self._running is None:
            self._running = {}
            for js in self.snap.running.values():
                self._running.setdefault(js.job.tenant, []).append(js)
            for jobs in self._running.values():
                jobs.sort(key=_by_priority)
        return [js for js in self._running.get(tenant, ()) if js.id not in self.preempted]

    def eligible(self, js: JobState, protected: list[float]) -> bool:
        """May `js` be preempted now? If only its minimum runtime protects it, note when that
        ends, so the pass can ask to be called again then."""
        if can_preempt(js, self.now, self.cfg):
            return True
        if js.job.preemptible and js.preemptions < self.cfg.max_preemptions:
            started = js.start_time if js.start_time is not None else self.now
            protected.append(started + guaranteed_runtime(js, self.cfg))
        return False

    def wait_for(self, protected: list[float]) -> float | None:
        until = min((t for t in protected if t > self.now), default=None)
        if until is not None:
            self.d.wake_at = until if self.d.wake_at is None else min(self.d.wake_at, until)
        return until

    def find_victims(self, req: Request, candidates: Iterable[JobState],
                     work: ClusterState | None = None) -> Victims | None:
        """`find_victims`, plus a retry for the case it misses: it only tries to place once the
        victims alone free the whole request, ignoring GPUs that are already free. The retry
        places after each victim and can go once the shared helper counts free GPUs."""
        work = work if work is not None else self.work
        seen: list[JobState] = []

        def record() -> Iterator[JobState]:
            for v in candidates:
                seen.append(v)
                yield v

        found = find_victims(work, req, record(), self.now, self.cfg)
        if found is not None or work.used_milli == work.gpu_free_milli.size * MILLI:
            return found
        scratch = work.copy()
        for i, v in enumerate(seen):
            scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
            alloc = place(scratch, req, self.cfg.placement)
            if alloc is not None:
                return _prune(work, req, seen[:i + 1], alloc, self.cfg.placement)
        return None

    def reclaim(self, js: JobState, t: TenantUsage) -> str | None:
        """Start `js` by preempting borrowed jobs in t's cohort; None on success, else why not."""
        req = js.job.request
        donors = [o for o in self.book.tenants.values()
                  if o.cohort == t.cohort and o is not t and o.gpu > o.nominal]
        if not donors:
            return f"no other tenant in cohort {t.cohort} is borrowing, so nothing to reclaim"
        key = ("reclaim", t.cohort, req)
        if key in self.failed:  # victims only get fewer within a pass: it would fail again
            return self.failed[key]
        borrowed = {o.name: o.borrowed for o in donors}
        protected: list[float] = []
        found = self.find_victims(req, self._borrowed_jobs(donors, protected))
        if found is None:
            until = self.wait_for(protected)
            names = ", ".join(sorted(borrowed))
            why = (f"reclaim from {names} waits for their jobs' minimum runtime "
                   f"(until t={until:.0f}s)" if until is not None else
                   f"preempting the borrowed jobs of {names} would not make room")
            self.failed[key] = why
            return why
        victims, scratch, alloc = found
        donors_used = sorted({v.job.tenant for v in victims})
        usage = {o.name: (o.gpu, o.nominal) for o in donors}
        self.preempt(victims, lambda v: (
            f"Reclaimed by {t.name}: {v.job.tenant} was borrowing "
            f"{gpus(borrowed[v.job.tenant])} GPUs ({gpus(usage[v.job.tenant][0])}/"
            f"{gpus(usage[v.job.tenant][1])} nominal)"))
        self.work = scratch
        after = t.gpu + req.gpu_milli_total
        self.start(js, t, alloc, f"Admitted: {t.name} reclaimed its nominal quota from "
                                 f"{', '.join(donors_used)} ({gpus(after)}/{gpus(t.nominal)} "
                                 f"GPUs with this job)")
        return None

    def _borrowed_jobs(self, donors: list[TenantUsage], protected: list[float]
                       ) -> Iterator[JobState]:
        """Victim candidates, lazily: always from the tenant that is currently the most over
        its quota, and only while it is still over it."""
        pool = [_Donor(o, self.running_of(o.name)) for o in donors]
        while pool:
            donor = min(pool, key=lambda x: (-x.left, x.tenant.name))
            js = donor.next() if donor.left > 0 else None
            if js is None:
                pool.remove(donor)
                continue
            if self.eligible(js, protected):
                donor.left -= js.job.request.gpu_milli_total
                yield js

    def within_tenant(self, js: JobState, t: TenantUsage) -> bool:
        """Start `js` by preempting lower-priority jobs of its own tenant: first enough to
        bring the tenant back within quota, then whatever placement still needs."""
        req, prio = js.job.request, js.job.priority
        key = ("within", t.name, req, prio)
        if key in self.failed:
            return False
        protected: list[float] = []
        cands = [v for v in self.running_of(t.name)
                 if v.job.priority < prio and self.eligible(v, protected)]
        freed, i = 0, 0
        while self.book.verdict(t, req.gpu_milli_total, freed).kind == NO_QUOTA:
            if i == len(cands):
                break
            freed += cands[i].job.request.gpu_milli_total
            i += 1
        found = None
        if self.book.verdict(t, req.gpu_milli_total, freed).kind != NO_QUOTA:
            forced, scratch = cands[:i], self.work.copy()
            for v in forced:
                scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
            alloc = place(scratch, req, self.cfg.placement)
            if alloc is not None and forced:
                found = (forced, scratch, alloc)
            elif alloc is None:
                more = self.find_victims(req, cands[i:], scratch)
                if more is not None:
                    found = (forced + more[0], more[1], more[2])
        if found is None:
            self.wait_for(protected)
            self.failed[key] = ""
            return False
        victims, scratch, alloc = found
        self.preempt(victims, lambda v: (
            f"Preempted by job {js.id} of {t.name}: priority {prio} over {v.job.priority}"))
        self.work = scratch
        v = self.book.verdict(t, req.gpu_milli_total)
        self.start(js, t, alloc, f"Admitted over lower-priority jobs of {t.name}: {v.text}")
        return True

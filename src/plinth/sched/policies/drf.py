"""Multi-tenant fair share: Kueue-style quotas in a cohort, admission ordered by DRF.

Each tenant is a Kueue ClusterQueue: nominal GPUs it is guaranteed, an optional borrowing
limit, a cohort and a weight (`TenantQuota`, see `plinth.sched.quota` for the borrowing rule).

- Quotas come from the `quotas` option, else `cluster.tenants`. With neither, every tenant seen
  so far (pending or running) gets an equal nominal share of all GPUs with unlimited borrowing;
  the list grows as new tenants appear and is remembered, so a tenant whose queue empties keeps
  its share and a tenant that arrives late is not stuck at zero. A tenant the configured quotas
  do not name has 0 nominal GPUs in cohort "default": it only runs on quota others leave idle.
- Admission: repeatedly take the tenant with the lowest weighted dominant share (DRF over GPU,
  CPU and memory) and try its next job. A job starts if it fits now and its tenant stays within
  nominal, or may borrow (jobs beyond nominal are "borrowing"). As Kueue orders its heads, a
  pass has two rounds: first the jobs within their tenant's nominal quota, then those that
  would borrow, each round in DRF order.
- Reclaim (Kueue's reclaimWithinCohort): a job that would keep its tenant within nominal but
  does not fit may preempt jobs of tenants in its cohort that are borrowing, the most-over-quota
  tenant first, each tenant's jobs in `victim_order` (lower priority, less unsaved work first).
  A tenant at or below nominal is never a victim; jobs no larger than what a tenant borrows are
  taken first, but when all its jobs are larger, one may take it below nominal (as in Kueue,
  else the reclaiming tenant could never get its guarantee). Borrowing jobs never preempt.
- Reservation (`reserve`, on by default), so that a stream of small jobs cannot starve big
  ones: the first job in line that waits for room gets the GPUs it would have when running
  jobs end as estimated (EASY backfill), and each tenant's first job that waits for quota holds
  its tenant's quota from when it is expected to be free. Later jobs may use reserved GPUs or
  held quota only if they are expected to end by then.
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
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence

from plinth.core.errors import SpecError
from plinth.core.resources import Allocation, Cluster, Request, TenantQuota
from plinth.sched.backfill import GPU_ONLY, masked, reservation, without_reserved
from plinth.sched.ends import RunningEnds
from plinth.sched.placement import place, placeable
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import can_preempt, find_victims, guaranteed_runtime, victim_order
from plinth.sched.quota import (
    NO_QUOTA,
    NOMINAL,
    Donor,
    QuotaBook,
    TenantQueue,
    TenantUsage,
    cluster_totals,
    derive_quotas,
    gpus,
    tenant_queues,
)
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, Snapshot, Start

Victims = tuple[list[JobState], ClusterState, Allocation]
Fixed = tuple[int, int, float, int]  # see `FairShare.fixed`

_by_priority = victim_order(lambda js: js.job.priority)
STARTED, WAITS, REPEAT = "started", "waits", "repeat"  # what `_Pass.admit` did with a job


class FairShare(Policy):
    """Fair share across tenants: Kueue-style quotas, borrowing and reclaim, ordered by DRF."""

    name = "drf"
    preemptive = True

    def __init__(self, *, quotas: Sequence[TenantQuota] | None = None, depth: int = 16,
                 reclaim: bool = True, preempt_within_tenant: bool = False,
                 strict_fifo: bool = False, reserve: bool = True,
                 preempt_depth: int = 32) -> None:
        if depth < 1:
            raise SpecError(f"drf.depth: must be at least 1, got {depth}")
        if preempt_depth < 0:
            raise SpecError(f"drf.preempt_depth: must not be negative, got {preempt_depth}")
        # At most this many reclaim searches per pass (each copies the cluster state); the
        # rest are reclaimed in the passes that follow, so one pass stays bounded.
        self.preempt_depth = preempt_depth
        self.quotas = tuple(quotas) if quotas is not None else None
        self.depth = depth
        self.reclaim = reclaim
        self.preempt_within_tenant = preempt_within_tenant
        self.strict_fifo = strict_fifo  # a tenant's blocked job also blocks the ones behind it
        self.reserve = reserve  # the first job waiting for room gets GPUs reserved (EASY)
        self._derived_for: Cluster | None = None
        self._seen: frozenset[str] = frozenset()
        self._derived: tuple[TenantQuota, ...] = ()
        self._totals_for: Cluster | None = None
        self._totals: tuple[int, int, int] = (0, 0, 0)
        # Kept between passes, as a pass reads the same waiting jobs again and again: per
        # waiting job, what `admit` reads of it that never changes while it waits (its spec
        # does not), and a code per (tenant, request, priority), equal for look-alike jobs.
        self._fixed: dict[JobState, Fixed] = {}
        self._codes: dict[tuple[str, Request, int], int] = {}

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

    def fixed(self, js: JobState) -> Fixed:
        """(id, code, estimated run time, milli-GPUs) of a waiting job, remembered."""
        job = js.job
        req = job.request
        # Pre-multiplied, to leave room for the key's other parts (see `_Pass.admit`).
        code = self._codes.setdefault((job.tenant, req, job.priority), 32 * len(self._codes))
        est = job.duration if job.time_limit is None else job.time_limit
        f = self._fixed[js] = (js.id, code, est, req.gpu_milli_total)
        return f

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        if len(self._fixed) > 2 * len(snap.pending) + 4096:
            self._fixed.clear()  # most are of jobs no longer waiting
        queues = tenant_queues(snap.pending, key=self.order)
        # The running jobs' usage, charged once per (tenant, request) with its count: a pass
        # rebuilds the book, and a big cluster runs tens of thousands of jobs of a few shapes.
        usage: dict[tuple[str, int], list] = {}
        for js in snap.running.values():
            job = js.job
            k = (job.tenant, id(job.request))
            e = usage.get(k)
            if e is None:
                usage[k] = [job.request, 1]
            else:
                e[1] += 1
        tenants = set(queues) | {name for name, _ in usage}
        if self._totals_for is not snap.cluster:
            self._totals_for, self._totals = snap.cluster, cluster_totals(snap.cluster)
        book = QuotaBook(self.quotas_for(snap.cluster, tenants), snap.cluster, self._totals)
        for (name, _), (req, n) in usage.items():
            book.charge(name, req, n)
        p = _Pass(self, snap, now, book)
        p.run(queues)
        return p.d


class _Pass:
    """One scheduling pass: the working state, the quota book and the decisions so far."""

    def __init__(self, policy: FairShare, snap: Snapshot, now: float, book: QuotaBook) -> None:
        self.policy, self.snap, self.now, self.book = policy, snap, now, book
        self.cfg = snap.config
        self.work = snap.state.copy()
        self.d = Decisions()
        self.preempted: set[int] = set()
        self.failed: dict[tuple, str] = {}  # preemption searches that failed in this pass
        self.tries_left = policy.preempt_depth
        self.blocked: dict[int, str] = {}  # see `admit`: reasons by key, at `blocked_at`
        self.blocked_at = 0  # the number of starts and preemptions when they were given
        self.fixed = policy._fixed.get
        self._running: dict[str, list[JobState]] | None = None
        self.reservation: tuple[int, float, frozenset[int]] | None = None  # job, from, GPUs
        self.avoid: ClusterState | None = None  # `work` with the reserved GPUs taken
        self.holds: dict[str, tuple[int, float]] = {}  # tenant -> job, time: see `hold`
        self.jobs: dict[int, JobState] = {}  # the jobs started, by id
        self.gpu_before = {name: t.gpu for name, t in book.tenants.items()}
        self._ends: RunningEnds | None = None  # see `cohort_ends`
        # Per request object: (a token equal for equal requests, its milli-GPUs). Runs of
        # look-alike jobs are read for every pass, and a request hashes all its fields.
        self._reqs: dict[int, tuple[int, int]] = {}
        self._canon: dict[Request, Request] = {}
        self._fits: dict[tuple[int, int], bool] = {}  # see `fits_work`

    def run(self, queues: dict[str, Sequence[JobState]]) -> None:
        """Two rounds, as Kueue orders its heads: first every job that keeps its tenant
        within nominal quota, then the jobs that would borrow. Lending quota first and then
        reclaiming it in the same pass would only thrash. In each round the tenant with the
        lowest weighted dominant share goes next."""
        qs = {name: TenantQueue(name, jobs) for name, jobs in queues.items()}
        self.round(qs, borrowing=False)
        for q in qs.values():
            q.second_round()
        self.round(qs, borrowing=True)

    def round(self, qs: dict[str, TenantQueue], borrowing: bool) -> None:
        book, depth, scan = self.book, self.policy.depth, max(self.cfg.backfill_depth, 1)

        def line(names: Iterable[str]) -> list[tuple[float, str]]:
            return [(book.share(book.tenant(n)), n) for n in names if qs[n].active]

        heap = line(qs)
        heapq.heapify(heap)
        while heap:
            q = qs[heapq.heappop(heap)[-1]]
            t, preempts = book.tenant(q.name), len(self.d.preempts)
            # A job that waits changes nothing, so the tenant keeps its turn for the jobs
            # behind it until one starts.
            while q.active:
                js = q.head
                assert js is not None
                milli = (self.fixed(js) or self.policy.fixed(js))[3]
                if not borrowing and t.gpu + milli > t.nominal:
                    # Held for the second round; if even borrowing cannot admit it now, hold
                    # the tenant's quota for it already, so that its small jobs in this
                    # round cannot starve it.
                    if (self.policy.reserve and q.name not in self.holds and not
                            book.admits(t, milli, t.gpu, book.cohort_usage[t.cohort])):
                        self.hold(js, t)
                    if t.gpu >= t.nominal:  # no job of it is within nominal any more
                        q.active = False
                        break
                    q.put_off()
                    if self.policy.strict_fifo or len(q.later) >= scan:
                        q.active = False  # nothing behind may go first / enough read
                    else:
                        self.put_off_run(q, t, scan)
                    continue
                q.advance()
                outcome = self.admit(js)
                if outcome == STARTED:
                    break
                # Starts cost a placement each and are bounded by the cluster; waiting jobs
                # are bounded per tenant: `depth` that needed a real check, `backfill_depth`
                # in all (as Slurm's bf_max_job_test), so small jobs still start from behind
                # a run of blocked big ones, while a long queue costs no more.
                q.waits += outcome == WAITS
                q.seen += 1
                if self.policy.strict_fifo:
                    why = f"Queue: behind job {js.id} of {q.name} (strict FIFO)"
                    behind = [*q.later, *([q.head] if q.head else []),
                              *itertools.islice(q.it, depth - 1)]
                    for other in behind:
                        self.d.waiting[other.id] = why
                    q.active, q.done, q.later, q.head = False, True, [], None
                elif q.waits >= depth or q.seen >= scan:
                    q.active = False
                else:
                    self.repeat_run(q, scan)
            if len(self.d.preempts) != preempts:
                # Victims' tenants now hold less, so their place in line moved up.
                heap = line(n for n in qs if n != q.name)
                heapq.heapify(heap)
            if q.active:
                heapq.heappush(heap, (book.share(t), q.name))

    def put_off_run(self, q: TenantQueue, t: TenantUsage, scan: int) -> None:
        """Put off, as the first round does one at a time, the jobs right behind one just put
        off that are over nominal quota too (nothing started since, so the tenant's usage is
        the same), up to the first that could take the tenant's quota hold: the caller reads
        that one, and any job within nominal quota."""
        if not q.active:
            return
        book, fixed, later, it = self.book, self.fixed, q.later, q.it
        room = t.nominal - t.gpu
        may_hold = self.policy.reserve and q.name not in self.holds
        admits: dict[int, bool] = {}  # by milli-GPUs: `book.admits` on the usage now
        js = q.head
        while True:
            milli = (fixed(js) or self.policy.fixed(js))[3]  # type: ignore[arg-type]
            if milli <= room:
                break
            if may_hold:
                ok = admits.get(milli)
                if ok is None:
                    ok = admits[milli] = book.admits(t, milli, t.gpu,
                                                     book.cohort_usage[t.cohort])
                if not ok:
                    break
            later.append(js)  # type: ignore[arg-type]
            js = next(it, None)
            if js is None or len(later) >= scan:
                q.active = False
                break
        q.head = js

    def repeat_run(self, q: TenantQueue, scan: int) -> None:
        """Give each job at the head of `q` whose key (see `admit`) is that of a job blocked
        since the last start or preemption that job's reason, as `admit` would (a REPEAT), and
        stop at the first that needs a real check. Runs of look-alike blocked jobs are most
        of what a pass reads: each costs a few attribute reads and a look-up."""
        if not q.active or self.blocked_at != len(self.d.starts) + len(self.d.preempts):
            return  # nothing left, or nothing blocked since the last change
        held, hold = self.reservation, self.holds.get(q.name)
        blocked, waiting, fixed, it, now = self.blocked, self.d.waiting, self.fixed, q.it, self.now
        # The key's parts that are the same for every job read here.
        base = (held is None) * 16 + (hold is None) * 4
        due = held[1] if held is not None else math.inf  # the reserved GPUs
        held_for, quota_due = (hold[0], hold[1]) if hold is not None else (None, math.inf)
        timed = held is not None or hold is not None
        seen, js = q.seen, q.head
        while True:
            jid, code, est, _ = fixed(js) or self.policy.fixed(js)  # type: ignore[arg-type]
            if timed:
                left = est - js.progress  # type: ignore[union-attr]
                end = now + (left if left > 0.0 else 0.0)  # max(0.0, left), as `admit`
                key = code + base + (end > due) * 8 + (end > quota_due) * 2 + (jid == held_for)
            else:
                key = code + base
            why = blocked.get(key)
            if why is None:
                break
            waiting[jid] = why
            seen += 1
            js = next(it, None)
            if js is None or seen >= scan:
                q.active = False
                break
        q.head, q.seen = js, seen

    # -- one job -----------------------------------------------------------------------------
    def admit(self, js: JobState) -> str:
        """STARTED, WAITS, or REPEAT: it waits for the same reason as an identical job before
        it (same tenant, request and priority, the same standing against the reservation and
        its tenant's quota hold, nothing started or preempted since), found without a
        placement, so runs of blocked look-alike jobs cost next to nothing."""
        held, hold = self.reservation, self.holds.get(js.job.tenant)
        jid, code, est, _ = self.fixed(js) or self.policy.fixed(js)
        # now + js.remaining_estimate, inlined: it runs for every job read
        end = self.now + max(0.0, est - js.progress) if held or hold else 0.0
        late = held is not None and end > held[1]
        # (code, held is None, late, hold is None, ends after the hold, is the hold's job)
        key = (code + (held is None) * 16 + late * 8 + (hold is None) * 4
               + (hold is not None and end > hold[1]) * 2 + (hold is not None and hold[0] == jid))
        version = len(self.d.starts) + len(self.d.preempts)
        if self.blocked_at != version:
            self.blocked.clear()
            self.blocked_at = version
        why = self.blocked.get(key)
        if why is not None:
            self.d.waiting[jid] = why
            return REPEAT
        if self._admit(js, late):
            return STARTED
        if self.blocked_at == len(self.d.starts) + len(self.d.preempts):
            self.blocked[key] = self.d.waiting[jid]
        return WAITS

    def _admit(self, js: JobState, late: bool) -> bool:
        t = self.book.tenant(js.job.tenant)
        req = js.job.request
        hold = self.holds.get(t.name)
        if (hold is not None and hold[0] != js.id and req.gpu_milli_total
                and self.now + js.remaining_estimate > hold[1]):
            self.d.waiting[js.id] = (f"Quota: would delay job {hold[0]} of {t.name}, first in "
                                     f"line for its quota from t={hold[1]:.0f}s")
            return False
        v = self.book.verdict(t, req.gpu_milli_total)
        if v.kind == NO_QUOTA:
            if self.policy.preempt_within_tenant and self.within_tenant(js, t):
                return True
            self.d.waiting[js.id] = v.text + (self.hold(js, t) if self.policy.reserve else "")
            return False
        # A job that would still run when the reserved GPUs are due must avoid them.
        held, avoid = self.reservation, self.avoid
        alloc = place(avoid if late and avoid is not None else self.work, req, self.cfg.placement)
        if alloc is not None:
            self.start(js, t, alloc, ("Admitted: " if v.kind == NOMINAL
                                      else "Admitted (borrowing): ") + v.text)
            return True
        if late and held is not None and self.fits_work(req):
            self.d.waiting[js.id] = (f"Resources: would delay job {held[0]}, which has GPUs "
                                     f"reserved from t={held[1]:.0f}s")
            return False
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
        if self.reservation is None and self.policy.reserve:
            why += self.reserve(js)
        # A job without GPUs waits for CPUs or memory, never for "0 GPUs".
        short = (f"{gpus(req.gpu_milli_total)} GPUs" if req.gpu_milli_total else
                 f"{req.workers * req.cpus_milli / 1000:g} CPUs and "
                 f"{req.workers * req.memory_mib / 1024:.3g} GiB of memory")
        self.d.waiting[js.id] = f"Resources: {short} not free; {why}"
        return False

    def reserve(self, js: JobState) -> str:
        """Reserve GPUs for the first job in line that waits for room (EASY backfill): later
        jobs may only take them if they end before it could start. Without this, a stream of
        small jobs starves gang jobs that need a whole node, and the queue silts up with them."""
        started = [(self.jobs[s.job_id], s.allocation) for s in self.d.starts]
        # Preempted jobs' GPUs are free already: they must not be released twice.
        res = reservation(self.snap, self.now, self.work, js, started, False, self.preempted)
        shadow = res.shadow
        if math.isinf(shadow):
            return ""
        reserved = res.gpus
        self.reservation = (js.id, shadow, reserved)
        self.avoid = without_reserved(self.work, reserved)
        return f"; first in line, GPUs reserved from t={shadow:.0f}s"

    def hold(self, js: JobState, t: TenantUsage) -> str:
        """Hold t's quota for its first job that waits for quota, as a reservation does for
        GPUs: t's later jobs may only start if they end before this one could. Otherwise
        quota freed a GPU at a time goes to small jobs and a large one waits for ever."""
        held = self.holds.get(t.name)
        if held is not None:
            return (f"; first in line for {t.name}'s quota, expected from t={held[1]:.0f}s"
                    if held[0] == js.id else "")
        when = self.book.expected_at(t, js.job.request.gpu_milli_total,
                                     self.cohort_ends(t.cohort))
        if when is None:
            return ""
        self.holds[t.name] = (js.id, when)
        return f"; first in line for {t.name}'s quota, expected from t={when:.0f}s"

    def cohort_ends(self, cohort: str) -> Iterator[tuple[float, str, int]]:
        """(expected end, tenant, milli-GPUs) of the jobs of `cohort` that hold GPUs now
        (running and not preempted, or started in this pass), by end then id, read lazily
        from the owner's index of expected ends: `hold` stops at the first end that frees
        enough."""
        if self._ends is None:
            self._ends = self.snap.ends or RunningEnds.of(self.snap.running, self.now)
        book = self.book
        fresh = [self.jobs[s.job_id] for s in self.d.starts]
        for end, js in self._ends.ordered(self.now, False, gone=self.preempted, fresh=fresh):
            name = js.job.tenant
            if book.tenant(name).cohort == cohort:
                yield end, name, self.req_info(js.job.request)[1]

    def fits_work(self, req: Request) -> bool:
        """`placeable(self.work, req)`, remembered until the next start or preemption (only
        those change `work`): late jobs that miss the reserved GPUs all ask it."""
        key = (self.req_info(req)[0], len(self.d.starts) + len(self.d.preempts))
        fits = self._fits.get(key)
        if fits is None:
            fits = self._fits[key] = placeable(self.work, req, self.cfg.placement)
        return fits

    def req_info(self, req: Request) -> tuple[int, int]:
        """(token, milli-GPUs) of a request: the token is the same for equal requests (the
        first such object's id), so keys built from it compare without hashing requests."""
        info = self._reqs.get(id(req))
        if info is None:
            canon = self._canon.setdefault(req, req)
            info = self._reqs[id(req)] = (id(canon), req.gpu_milli_total)
        return info

    def set_work(self, work: ClusterState) -> None:
        """Plan on `work` from now on (after preemptions released GPUs)."""
        self.work = work
        if self.reservation is not None:
            self.avoid = without_reserved(work, self.reservation[2])

    def start(self, js: JobState, t: TenantUsage, alloc: Allocation, reason: str) -> None:
        self.jobs[js.id] = js
        self.work.allocate(alloc, js.job.request)
        if self.avoid is not None and self.reservation is not None:
            self.avoid.allocate(masked(alloc, self.reservation[2]), GPU_ONLY)
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
        return find_victims(work if work is not None else self.work, req, candidates,
                            self.now, self.cfg)

    def borrowed(self, o: TenantUsage) -> int:
        """What o borrows and may be reclaimed: only what it borrowed before this pass, as
        anything it started in this pass came after every job within nominal quota."""
        return min(o.gpu, self.gpu_before.get(o.name, 0)) - o.nominal

    def reclaim(self, js: JobState, t: TenantUsage) -> str | None:
        """Start `js` by preempting borrowed jobs in t's cohort; None on success, else why not."""
        req = js.job.request
        donors = [o for o in self.book.tenants.values()
                  if o.cohort == t.cohort and o is not t and self.borrowed(o) > 0]
        if not donors:
            return f"no other tenant in cohort {t.cohort} is borrowing, so nothing to reclaim"
        key = ("reclaim", t.cohort, req)
        if key in self.failed:  # victims only get fewer within a pass: it would fail again
            return self.failed[key]
        if self.tries_left <= 0:
            soon = self.now + 1.0
            self.d.wake_at = soon if self.d.wake_at is None else min(self.d.wake_at, soon)
            return "reclaim deferred to the next pass (per-pass limit reached)"
        self.tries_left -= 1
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
        self.set_work(scratch)
        after = t.gpu + req.gpu_milli_total
        self.start(js, t, alloc, f"Admitted: {t.name} reclaimed its nominal quota from "
                                 f"{', '.join(donors_used)} ({gpus(after)}/{gpus(t.nominal)} "
                                 f"GPUs with this job)")
        return None

    def _borrowed_jobs(self, donors: list[TenantUsage], protected: list[float]
                       ) -> Iterator[JobState]:
        """Victim candidates, lazily: always from the tenant that is currently the most over
        its quota, and only while it is still over it."""
        pool = [Donor(o, self.borrowed(o), self.running_of(o.name)) for o in donors]
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
        book, milli, freed, i = self.book, req.gpu_milli_total, 0, 0

        def admits() -> bool:
            return book.admits(t, milli, t.gpu - freed, book.cohort_usage[t.cohort] - freed)

        while not admits() and i < len(cands):
            freed += cands[i].job.request.gpu_milli_total
            i += 1
        found = None
        if admits():
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
        self.set_work(scratch)
        v = self.book.verdict(t, req.gpu_milli_total)
        self.start(js, t, alloc, f"Admitted over lower-priority jobs of {t.name}: {v.text}")
        return True

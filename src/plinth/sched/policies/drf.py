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
  Reclaim and preemption live in `drf_reclaim`.
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
get no new reason. A job examined whose reason is the one it already has (`JobState.reason`,
set by the owner from an earlier pass) is left out of `Decisions.waiting`: most waiting jobs
wait for the same reason pass after pass, and the owner would only write it again.

After a pass, until something is freed (a job ends or is stopped, a timer fires, the cluster
or the quotas change), the waiting jobs are set aside as Kueue sets aside inadmissible
workloads: a pass after which only jobs arrived (`Snapshot.arrived`) reads the new jobs alone,
against the GPUs reserved and the quota held by the pass before (see `FairShare.arrivals`).
Its times (the reservation's, the holds') end the set-aside when they come. A new job that
reclaims quota makes its pass read the whole queue again, as its victims may free more than
it needs.

In the borrowing round, a tenant that may borrow nothing more (its cohort's quota all used,
or its borrowing limit reached) and has no waiting job without GPUs is read no further than
its first waiting job (`_Pass.spent`): no job of it could start, and the jobs behind keep the
reasons they were last given.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence

from sortedcontainers import SortedKeyList

from plinth.core.errors import SpecError
from plinth.core.resources import Allocation, Cluster, Request, TenantQuota
from plinth.sched.backfill import GPU_ONLY, masked, reservation, without_reserved
from plinth.sched.ends import RunningEnds
from plinth.core.lifecycle import State
from plinth.sched.pending import GpulessCount
from plinth.sched.placement import place, placeable
from plinth.sched.policies.base import Policy
from plinth.sched.policies.drf_reclaim import Reclaim
from plinth.sched.quota import (
    NO_QUOTA,
    NOMINAL,
    QuotaBook,
    TenantQueue,
    TenantUsage,
    cluster_totals,
    derive_quotas,
    gpus,
    tenant_queues,
)
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Snapshot, Start

Fixed = tuple[int, int, float, int]  # see `FairShare.fixed`

STARTED, WAITS, REPEAT = "started", "waits", "repeat"  # what `_Pass.admit` did with a job


class FairShare(Policy):
    """Fair share across tenants: Kueue-style quotas, borrowing and reclaim, ordered by DRF."""

    name = "drf"
    preemptive = True
    reads_arrivals = True

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
        self._carry: _Carry | None = None  # what the last pass promised: see `arrivals`

    def pending_queue(self, jobs: Iterable[JobState] = ()) -> SortedKeyList:
        return GpulessCount(jobs, key=self.order)

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
        carry, self._carry = self._carry, None
        if carry is not None and not carry.stands(snap, now):
            carry = None
        queues = (tenant_queues(snap.pending, key=self.order) if carry is None
                  else self.arrivals(snap))
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
        quotas = self.quotas_for(snap.cluster, tenants)
        if carry is not None and quotas is not carry.quotas:  # a new tenant: new equal shares
            carry, queues = None, tenant_queues(snap.pending, key=self.order)
        book = QuotaBook(quotas, snap.cluster, self._totals)
        for (name, _), (req, n) in usage.items():
            book.charge(name, req, n)
        p = _Pass(self, snap, now, book)
        if carry is not None:
            p.reservation, p.holds = carry.reservation, dict(carry.holds)
            p.promised = list(carry.promised)
            if p.reservation is not None:
                p.avoid = without_reserved(p.work, p.reservation[2])
        p.run(queues)
        if carry is not None and p.d.preempts:
            # A new job reclaimed quota: what its victims free beyond its need may admit jobs
            # set aside, so this pass is done again over the whole queue.
            return self.schedule(dataclasses.replace(snap, arrived=None), now)
        if not p.d.preempts and not self.strict_fifo:
            self._carry = _Carry(snap, quotas, p)
        return p.d

    def arrivals(self, snap: Snapshot) -> dict[str, Sequence[JobState]]:
        """The queues of a pass after which only jobs arrived (`Snapshot.arrived`): each
        tenant's new jobs, in queue order. As Kueue sets inadmissible workloads aside until
        an event in their cohort could admit them, the jobs that waited in the last pass are
        not read again: nothing was freed since, so each would wait again. The new jobs are
        checked against what that pass promised (the GPUs reserved for the first job in line,
        each tenant's quota hold). A new job further back in its tenant's queue than a pass
        reads (`backfill_depth`) waits unread, as it would in a full pass."""
        pending, scan = snap.pending, max(snap.config.backfill_depth, 1)
        queues: dict[str, list[JobState]] = {}
        for js in sorted(snap.arrived or (), key=self.order):
            tenant = js.job.tenant
            if (pending.bisect_key_left(self.order(js))  # type: ignore[attr-defined]
                    - pending.bisect_key_left((tenant,)) < scan):  # type: ignore[attr-defined]
                queues.setdefault(tenant, []).append(js)
        return queues  # type: ignore[return-value]


class _Carry:
    """What a pass promised, kept for the next if only jobs arrive in between: the GPUs
    reserved for the first job in line and each tenant's quota hold. It stands while the
    owner's queue and state are the same objects, the quotas the same, the jobs it was made
    for still wait, and none of its times has come."""

    __slots__ = ("holds", "pending", "promised", "quotas", "reservation", "state", "until")

    def __init__(self, snap: Snapshot, quotas: tuple[TenantQuota, ...], p: _Pass) -> None:
        self.pending, self.state, self.quotas = snap.pending, snap.state, quotas
        self.reservation, self.holds, self.promised = p.reservation, p.holds, p.promised
        self.until = min([t for _, t in p.holds.values()]
                         + ([p.reservation[1]] if p.reservation is not None else []),
                         default=math.inf)

    def stands(self, snap: Snapshot, now: float) -> bool:
        return (snap.arrived is not None and snap.pending is self.pending
                and snap.state is self.state and now < self.until
                and hasattr(snap.pending, "bisect_key_left")
                and all(js.status is State.PENDING for js in self.promised))


class _Pass(Reclaim):
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
        # Each tenant's waiting jobs that ask for no GPU, where the queue counts them.
        self.gpuless = snap.pending.gpuless if isinstance(snap.pending, GpulessCount) else None
        self._running: dict[str, list[JobState]] | None = None
        self.reservation: tuple[int, float, frozenset[int]] | None = None  # job, from, GPUs
        self.avoid: ClusterState | None = None  # `work` with the reserved GPUs taken
        self.holds: dict[str, tuple[int, float]] = {}  # tenant -> job, time: see `hold`
        self.promised: list[JobState] = []  # the jobs of the reservation and the holds
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
                        if other.reason != why:
                            self.d.waiting[other.id] = why
                    q.active, q.done, q.later, q.head = False, True, [], None
                elif q.waits >= depth or q.seen >= scan:
                    q.active = False
                elif borrowing and self.spent(t):
                    q.active = False  # nothing more of it can start: the rest wait unread
                else:
                    self.repeat_run(q, scan)
            if len(self.d.preempts) != preempts:
                # Victims' tenants now hold less, so their place in line moved up.
                heap = line(n for n in qs if n != q.name)
                heapq.heapify(heap)
            if q.active:
                heapq.heappush(heap, (book.share(t), q.name))

    def spent(self, t: TenantUsage) -> bool:
        """Whether none of t's jobs still waiting can start in this pass: each would borrow
        (t is at or over nominal quota and none of them asks for no GPU), and t may borrow
        nothing more (the cohort's quota is all used, or t's borrowing limit reached). Its
        usage and the cohort's only grow in the borrowing round, as borrowing jobs never
        preempt, so this holds for the rest of the pass."""
        return (t.gpu >= t.nominal and self.gpuless is not None and not self.gpuless[t.name]
                and not self.policy.preempt_within_tenant
                and not self.book.admits(t, 1, t.gpu, self.book.cohort_usage[t.cohort]))

    def put_off_run(self, q: TenantQueue, t: TenantUsage, scan: int) -> None:
        """Put off, as the first round does one at a time, the jobs right behind one just put
        off that are over nominal quota too (nothing started since, so the tenant's usage is
        the same), up to the first that could take the tenant's quota hold: the caller reads
        that one, and any job within nominal quota."""
        if not q.active:
            return
        book, fixed, new, later = self.book, self.fixed, self.policy.fixed, q.later
        room = t.nominal - t.gpu
        may_hold = self.policy.reserve and q.name not in self.holds
        admits: dict[int, bool] = {}  # by milli-GPUs: `book.admits` on the usage now
        for js in itertools.islice(itertools.chain((q.head,), q.it), scan - len(later)):
            milli = (fixed(js) or new(js))[3]
            if milli <= room:
                break
            if may_hold:
                ok = admits.get(milli)
                if ok is None:
                    ok = admits[milli] = book.admits(t, milli, t.gpu,
                                                     book.cohort_usage[t.cohort])
                if not ok:
                    break
            later.append(js)
        else:  # `scan` put off (or none left): the next one waits unread
            q.head, q.active = next(q.it, None), False
            return
        q.head = js

    def repeat_run(self, q: TenantQueue, scan: int) -> None:
        """Give each job at the head of `q` whose key (see `admit`) is that of a job blocked
        since the last start or preemption that job's reason, as `admit` would (a REPEAT), and
        stop at the first that needs a real check. Runs of look-alike blocked jobs are most
        of what a pass reads: each costs a few attribute reads and a look-up."""
        if not q.active or self.blocked_at != len(self.d.starts) + len(self.d.preempts):
            return  # nothing left, or nothing blocked since the last change
        held, hold = self.reservation, self.holds.get(q.name)
        blocked, waiting, fixed, now = self.blocked, self.d.waiting, self.fixed, self.now
        new = self.policy.fixed
        # The key's parts that are the same for every job read here.
        base = (held is None) * 16 + (hold is None) * 4
        due = held[1] if held is not None else math.inf  # the reserved GPUs
        held_for, quota_due = (hold[0], hold[1]) if hold is not None else (None, math.inf)
        read = 0
        # At most `scan - seen` jobs from the head on; `it` stays just past the last one read.
        jobs = itertools.islice(itertools.chain((q.head,), q.it), scan - q.seen)
        if held is None and hold is None:  # the key is the code and `base`
            for js in jobs:
                jid, code, _, _ = fixed(js) or new(js)
                why = blocked.get(code + base)
                if why is None:
                    break
                if js.reason != why:  # the owner has it already otherwise
                    waiting[jid] = why
                read += 1
            else:
                js = None
        else:
            for js in jobs:
                jid, code, est, _ = fixed(js) or new(js)
                left = est - js.progress
                end = now + (left if left > 0.0 else 0.0)  # max(0.0, left), as `admit`
                why = blocked.get(code + base + (end > due) * 8 + (end > quota_due) * 2
                                  + (jid == held_for))
                if why is None:
                    break
                if js.reason != why:
                    waiting[jid] = why
                read += 1
            else:
                js = None
        q.seen += read
        if js is None:  # all read up to the limit (or the end): the next one waits unread
            q.head, q.active = next(q.it, None), False
        else:
            q.head = js

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
            if js.reason != why:
                self.d.waiting[jid] = why
            return REPEAT
        if self._admit(js, late):
            return STARTED
        why = self.d.waiting[jid]
        if self.blocked_at == len(self.d.starts) + len(self.d.preempts):
            self.blocked[key] = why
        if js.reason == why:  # the owner has it already (see `FairShare.schedule`)
            del self.d.waiting[jid]
        return WAITS

    def _admit(self, js: JobState, late: bool) -> bool:
        t = self.book.tenant(js.job.tenant)
        req = js.job.request
        hold = self.holds.get(t.name)
        if (hold is not None and hold[0] != js.id and req.gpu_milli_total
                and self.now + js.remaining_estimate > hold[1]):
            # (No time: the first job's own reason has it, and a reason that moves with
            # every pass would be written again for each job behind it, pass after pass.)
            self.d.waiting[js.id] = (f"Quota: would delay job {hold[0]} of {t.name}, first in "
                                     "line for its quota")
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
            self.d.waiting[js.id] = f"Resources: would delay job {held[0]}, which has GPUs reserved"
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
        self.promised.append(js)
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
        self.promised.append(js)
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

    def start(self, js: JobState, t: TenantUsage, alloc: Allocation, reason: str) -> None:
        self.jobs[js.id] = js
        self.work.allocate(alloc, js.job.request)
        if self.avoid is not None and self.reservation is not None:
            self.avoid.allocate(masked(alloc, self.reservation[2]), GPU_ONLY)
        self.book.charge(t.name, js.job.request)
        self.d.starts.append(Start(js.id, alloc, reason))

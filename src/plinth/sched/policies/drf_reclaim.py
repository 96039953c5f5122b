"""Reclaim and preemption for the fair-share policy (`plinth.sched.policies.drf`).

Kueue's reclaimWithinCohort: a job that would keep its tenant within nominal quota but does not
fit may preempt jobs of tenants in its cohort that borrow, the most-over-quota tenant first.
With `preempt_within_tenant`, a job may also preempt lower-priority jobs of its own tenant
(Kueue's withinClusterQueue). Both plan on a copy of the pass's working state and, when they
find victims, preempt them and start the job in the same pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from plinth.core.resources import Allocation, Request
from plinth.sched.backfill import without_reserved
from plinth.sched.placement import place
from plinth.sched.preemption import can_preempt, find_victims, guaranteed_runtime, victim_order
from plinth.sched.quota import Donor, QuotaBook, TenantUsage, gpus
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, SchedConfig, Snapshot

Victims = tuple[list[JobState], ClusterState, Allocation]

_by_priority = victim_order(lambda js: js.job.priority)


class Reclaim:
    """The preempting part of a DRF pass (`drf._Pass` inherits it). It reads and changes the
    pass's working state: `work`, `book`, the decisions `d` and the jobs `preempted` so far,
    and it starts a job through the pass's `start`."""

    snap: Snapshot
    now: float
    cfg: SchedConfig
    book: QuotaBook
    d: Decisions
    work: ClusterState
    avoid: ClusterState | None
    reservation: tuple[int, float, frozenset[int]] | None
    preempted: set[int]
    failed: dict[tuple, str]  # preemption searches that failed in this pass
    tries_left: int  # reclaim searches left in this pass (`FairShare.preempt_depth`)
    gpu_before: dict[str, int]  # each tenant's milli-GPUs at the start of the pass
    _running: dict[str, list[JobState]] | None

    def start(self, js: JobState, t: TenantUsage, alloc: Allocation, reason: str) -> None:
        raise NotImplementedError  # pragma: no cover - the pass's own

    def set_work(self, work: ClusterState) -> None:
        """Plan on `work` from now on (after preemptions released GPUs)."""
        self.work = work
        if self.reservation is not None:
            self.avoid = without_reserved(work, self.reservation[2])

    def preempt(self, victims: list[JobState], reason) -> None:
        for v in victims:
            self.d.preempts.append(Preempt(v.id, reason(v)))
            self.book.charge(v.job.tenant, v.job.request, -1)
            self.preempted.add(v.id)

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

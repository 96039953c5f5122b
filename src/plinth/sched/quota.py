"""Tenant quotas as Kueue ClusterQueues in a cohort: nominal GPUs, borrowing, DRF shares.

A `QuotaBook` is built fresh for each scheduling pass from the running jobs, then charged and
credited as the pass plans starts and preemptions. GPU amounts are kept in milli-GPUs (ints) so
that fractional jobs add up exactly; reasons print them in GPUs.

Borrowing follows Kueue: a tenant may go beyond its nominal quota only by using nominal quota
that other tenants of its cohort leave idle, and only up to its own borrowing limit. What other
tenants already borrow is taken out of that idle pool first, so two borrowers can never lend
themselves the same idle GPU twice (equivalently: the cohort's usage never exceeds the sum of
its nominal quotas through borrowing).

Also here, as tenant book-keeping for the fair-share policy: each tenant's slice of the pending
queue (`tenant_queues`) and a borrowing tenant's jobs handed out as reclaim victims (`Donor`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plinth.core.resources import MILLI, Cluster, Request, TenantQuota
from plinth.sched.types import JobState

# How a tenant would hold a job it asks to start.
NOMINAL, BORROW, NO_QUOTA = "nominal", "borrow", "no-quota"
# The most GPUs a quota or a borrowing limit may name: far beyond any cluster, and small enough
# that milli-GPUs stay exact ints. The API refuses more; a store written before it did may hold
# 1e308, inf or NaN, which `platform_quotas` reads as this bound (NaN: as no quota) so that no
# pass overflows.
MAX_QUOTA_GPUS = 1 << 20


def gpus(milli: int) -> str:
    """Milli-GPUs as a short GPU count for reasons: 16, 0.5."""
    return f"{milli / MILLI:g}"


def cluster_totals(cluster: Cluster) -> tuple[int, int, int]:
    """The cluster's milli-GPUs, milli-CPUs and MiB of memory, the denominators of shares."""
    return (cluster.total_gpus * MILLI, sum(n.cpus_milli for n in cluster.nodes),
            sum(n.memory_mib for n in cluster.nodes))


def equal_shares(total_gpus: float, n: int) -> list[float]:
    """`total_gpus` split `n` ways in whole milli-GPUs that add up to it exactly (the first
    shares take the remainder). Rounded each on its own, 4 GPUs in three went 1.333 each, and
    no tenant could ever borrow its way to a 4-GPU job."""
    base, extra = divmod(round(total_gpus * MILLI), n)
    return [(base + (i < extra)) / MILLI for i in range(n)]


def derive_quotas(cluster: Cluster, tenants: Iterable[str]) -> tuple[TenantQuota, ...]:
    """Equal nominal shares of all GPUs among `tenants`, unlimited borrowing, one cohort."""
    names = sorted(set(tenants))
    if not names:
        return ()
    return tuple(TenantQuota(n, share)
                 for n, share in zip(names, equal_shares(cluster.total_gpus, len(names)),
                                     strict=True))


def platform_quotas(tenants: Iterable[Mapping[str, Any]], total_gpus: float
                    ) -> tuple[TenantQuota, ...]:
    """The quotas of the platform's tenants (rows with `name`, `gpus`, `borrowing_limit`).

    None if no tenant has a GPU quota: DRF then gives every tenant it sees an equal share
    (`derive_quotas`). Otherwise each tenant without a quota gets an equal share of the GPUs
    the explicit quotas leave, so `default` is not held to 0 nominal GPUs (and preempted on
    every reclaim) as soon as another tenant is given a quota."""
    rows = [{**t, "gpus": _bounded(t["gpus"]), "borrowing_limit": _bounded(t["borrowing_limit"])}
            for t in tenants]
    unset = [t for t in rows if t["gpus"] is None]
    if len(unset) == len(rows):
        return ()
    left = max(0.0, total_gpus - sum(t["gpus"] for t in rows if t["gpus"] is not None))
    rest = iter(equal_shares(left, len(unset)) if unset else ())
    return tuple(TenantQuota(t["name"], next(rest) if t["gpus"] is None else t["gpus"],
                             t["borrowing_limit"]) for t in rows)


def _bounded(value: float | None) -> float | None:
    """A stored quota within [0, MAX_QUOTA_GPUS]; None for none (or NaN)."""
    if value is None or math.isnan(value):
        return None
    return min(max(float(value), 0.0), float(MAX_QUOTA_GPUS))


@dataclass(slots=True)
class TenantUsage:
    name: str
    nominal: int  # milli-GPUs guaranteed
    limit: int | None  # milli-GPUs it may borrow beyond nominal; None: no limit
    cohort: str
    weight: float
    configured: bool  # False: a tenant the quotas do not name (0 nominal, borrow only)
    gpu: int = 0  # milli-GPUs in use
    cpu: int = 0  # milli-CPUs in use
    mem: int = 0  # MiB in use

    @property
    def borrowed(self) -> int:
        return max(0, self.gpu - self.nominal)

    def usage_text(self) -> str:
        return f"{self.name} uses {gpus(self.gpu)}/{gpus(self.nominal)} nominal GPUs"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str  # NOMINAL, BORROW or NO_QUOTA
    text: str  # the quota part of a reason a user reads


class QuotaBook:
    """Per-pass usage of every tenant and cohort, and the admission rule."""

    __slots__ = ("_tot_cpu", "_tot_gpu", "_tot_mem", "cohort_nominal", "cohort_usage", "tenants")

    def __init__(self, quotas: Sequence[TenantQuota], cluster: Cluster,
                 totals: tuple[int, int, int] | None = None) -> None:
        """`totals` is `cluster_totals(cluster)`, if the caller keeps it between passes."""
        self.tenants: dict[str, TenantUsage] = {}
        self.cohort_nominal: dict[str, int] = {}
        self.cohort_usage: dict[str, int] = {}
        self._tot_gpu, self._tot_cpu, self._tot_mem = totals or cluster_totals(cluster)
        for q in quotas:
            limit = None if q.borrowing_limit is None else round(q.borrowing_limit * MILLI)
            self._add(TenantUsage(q.name, round(q.nominal_gpus * MILLI), limit, q.cohort,
                                  q.weight if q.weight > 0 else 1.0, True))

    def _add(self, t: TenantUsage) -> TenantUsage:
        self.tenants[t.name] = t
        self.cohort_nominal[t.cohort] = self.cohort_nominal.get(t.cohort, 0) + t.nominal
        self.cohort_usage.setdefault(t.cohort, 0)
        return t

    def tenant(self, name: str) -> TenantUsage:
        """The tenant's usage; an unknown name is a tenant with 0 nominal GPUs in the default
        cohort, so its jobs can still run on quota that others leave idle."""
        t = self.tenants.get(name)
        return t if t is not None else self._add(TenantUsage(name, 0, None, "default", 1.0, False))

    def charge(self, tenant: str, req: Request, times: int = 1) -> None:
        """Charge `req` to the tenant `times` times (-1: credit it back)."""
        t = self.tenant(tenant)
        g = times * req.gpu_milli_total
        t.gpu += g
        t.cpu += times * req.cpus_milli * req.workers
        t.mem += times * req.memory_mib * req.workers
        self.cohort_usage[t.cohort] += g

    def share(self, t: TenantUsage) -> float:
        """Weighted dominant share: the largest of its GPU, CPU and memory shares of the
        cluster, divided by its weight (DRF)."""
        s = max(t.gpu / self._tot_gpu,
                t.cpu / self._tot_cpu if self._tot_cpu else 0.0,
                t.mem / self._tot_mem if self._tot_mem else 0.0)
        return s / t.weight

    def cohort_idle(self, t: TenantUsage) -> int:
        """Nominal quota of the other tenants in t's cohort that is neither used nor already
        lent out: Σ over others of (nominal - usage), which nets out their borrowing."""
        others_nominal = self.cohort_nominal[t.cohort] - t.nominal
        others_usage = self.cohort_usage[t.cohort] - t.gpu
        return max(0, others_nominal - others_usage)

    def admits(self, t: TenantUsage, milli: int, used: int, cohort_used: int) -> bool:
        """The rule `verdict` explains, on given usage: within nominal, or borrowing within
        the limit while the cohort's usage stays within its nominal quota."""
        after = used + milli
        if after <= t.nominal or milli == 0:
            return True
        if t.limit is not None and after - t.nominal > t.limit:
            return False
        return cohort_used + milli <= self.cohort_nominal[t.cohort]

    def expected_at(self, t: TenantUsage, milli: int,
                    ends: Iterable[tuple[float, str, int]]) -> float | None:
        """When t could start a job of `milli`, if the running jobs end as estimated. `ends`
        holds (end time, tenant, milli-GPUs) of the running jobs in t's cohort, by time."""
        used, cohort_used = t.gpu, self.cohort_usage[t.cohort]
        for end, tenant, held in ends:
            cohort_used -= held
            if tenant == t.name:
                used -= held
            if self.admits(t, milli, used, cohort_used):
                return end
        return None

    def verdict(self, t: TenantUsage, milli: int) -> Verdict:
        """May t start a job of `milli` milli-GPUs, and why (or why not) in words?"""
        after = t.gpu + milli
        if after <= t.nominal:
            return Verdict(NOMINAL, f"{t.name} within nominal quota "
                                    f"({gpus(after)}/{gpus(t.nominal)} GPUs with this job)")
        if milli == 0:  # GPU quota does not limit it, but it is no guarantee to reclaim with
            return Verdict(BORROW, f"{t.name} uses {gpus(t.gpu)}/{gpus(t.nominal)} nominal "
                                   f"GPUs, and this job asks for none")
        borrow = after - t.nominal
        others = self.cohort_nominal[t.cohort] - t.nominal
        most = others if t.limit is None else min(others, t.limit)
        if milli > t.nominal + most:
            return Verdict(NO_QUOTA, f"Quota: this job asks for {gpus(milli)} GPUs, more than "
                                     f"{t.name} can ever hold ({gpus(t.nominal)} nominal + "
                                     f"{gpus(most)} it may borrow)")
        now_text = f"{t.name} uses {gpus(t.gpu)}/{gpus(t.nominal)} nominal GPUs"
        if t.limit is not None and borrow > t.limit:
            return Verdict(NO_QUOTA, f"Quota: {now_text}; this job ({gpus(milli)} GPUs) would "
                                     f"borrow {gpus(borrow)}, over its borrowing limit of "
                                     f"{gpus(t.limit)}")
        # Say it as the user sees it: how much more it must borrow, and what is still idle
        # once its own current borrowing is counted.
        more = after - max(t.gpu, t.nominal)
        spare = max(0, self.cohort_idle(t) - t.borrowed)
        if more > spare:
            return Verdict(NO_QUOTA, f"Quota: {now_text} and cannot borrow {gpus(more)} more "
                                     f"(cohort {t.cohort} has {gpus(spare)} idle)")
        return Verdict(BORROW, f"{t.name} borrowing {gpus(borrow)} GPUs from cohort {t.cohort} "
                               f"({gpus(after)}/{gpus(t.nominal)} nominal with this job)")


# -- tenants' jobs ---------------------------------------------------------------------------

def tenant_queues(pending: Sequence[JobState], check: int = 16,
                  key: Callable[[JobState], tuple] | None = None
                  ) -> dict[str, Sequence[JobState]]:
    """Each tenant's pending jobs in queue order, as views into `pending` (no copies).

    `pending` is sorted by the policy's order, so grouped by tenant, and each group's end is
    found by binary search. A queue caught not grouped (say, kept in submit order) is split
    by a full scan instead: the first `check` jobs of each group must be the group's tenant,
    and a group that ends sooner must end where the search says.

    A sorted container kept by `key` (an order whose first field is the tenant) is grouped by
    construction: its own index finds each group's end, with no checks.
    """
    queues: dict[str, Sequence[JobState]] = {}
    n, i, last = len(pending), 0, None
    if key is not None and hasattr(pending, "bisect_key_left") and \
            getattr(pending, "key", None) == key:
        while i < n:
            t = pending[i].job.tenant
            # t + NUL is the least name above t: the search lands on the next tenant's first.
            end = pending.bisect_key_left((t + "\0",))  # type: ignore[attr-defined]
            queues[t] = _View(pending, i, end)
            i = end
        return queues
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

    __slots__ = ("hi", "lo", "seq")

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

    def __iter__(self) -> Iterator[JobState]:
        islice = getattr(self.seq, "islice", None)  # a sorted container walks in O(1) a step
        if islice is not None:
            return iter(islice(self.lo, self.hi))
        return (self.seq[k] for k in range(self.lo, self.hi))


class TenantQueue:
    """A tenant's pending jobs being read in this pass: the next one, and those put off to
    the borrowing round."""

    __slots__ = ("active", "done", "head", "it", "later", "name", "seen", "waits")

    def __init__(self, name: str, jobs: Sequence[JobState]) -> None:
        self.name, self.it = name, iter(jobs)
        self.head: JobState | None = next(self.it, None)
        self.waits = self.seen = 0  # jobs that waited: after a real check, and in all
        self.later: list[JobState] = []
        self.active = self.head is not None  # more to read in this round
        self.done = False  # nothing more in this pass (strict FIFO)

    def advance(self) -> None:
        self.head = next(self.it, None)
        self.active = self.active and self.head is not None

    def put_off(self) -> None:
        self.later.append(self.head)  # type: ignore[arg-type]
        self.advance()

    def second_round(self) -> None:
        """Read again: the jobs put off first, then from where the first round stopped."""
        rest = [self.head] if self.head is not None else []
        self.it = itertools.chain(self.later, rest, self.it)
        self.later, self.waits, self.seen = [], 0, 0
        self.head = next(self.it, None)
        self.active = self.head is not None and not self.done


class Donor:
    """A borrowing tenant's preemptible jobs, handed out as reclaim victims. Jobs no larger
    than what it still borrows come first, so reclaim tries not to push it below nominal."""

    __slots__ = ("deferred", "dpos", "jobs", "left", "pos", "tenant")

    def __init__(self, tenant: TenantUsage, borrowed: int, jobs: list[JobState]) -> None:
        self.tenant, self.left, self.jobs, self.pos = tenant, borrowed, jobs, 0
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

"""Replay a per-minute request trace against the autoscaling policies, in virtual time.

Requests arrive as a Poisson process within each minute (the trace's count, uniformly spread; a
trace with request timestamps, like the Azure LLM trace, is replayed at its own times) and
take a lognormal service time on one replica (1 CPU, one request at a time). The router keeps at
most 4 requests in flight per replica and at most 50 queued, so a job holds at most
50 + 3·replicas waiting requests; more are dropped. A new replica serves only after a cold start.
Scaling down removes starting replicas first, then the replicas that free up last; a removed
replica finishes the requests it already holds.

Control events sit on a heap of (time, kind, sequence), as in `plinth.sim.engine`, so ties break
the same way on every run: at one instant the minute closes before the controller ticks. Between
ticks each job's queue is advanced request by request with the multi-server FIFO recursion
(start = max(arrival, earliest free replica)). The arrivals and service times come from one rng
stream per job, so every policy sees exactly the same requests for a given seed.

Policies see, at each tick, the last window's arrivals and the p99 latency of the requests that
arrived in it (a request dropped by a full queue counts as 10 × SLO; one shed by admission
control is left out), and the requests in the system now. In the metrics every dropped request,
shed or not, is an SLO violation.
"""

from __future__ import annotations

import heapq
import time as wallclock
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from plinth.core.errors import SpecError
from plinth.serve.controller import Controller
from plinth.serve.policies.base import TICK_S, Policy, fair_share
from plinth.serve.solver import check_quota
from plinth.serve.traces import CountTrace, ServiceTime
from plinth.serve.types import Snapshot
from plinth.serve.utility import drop_penalty, relaxed_utility

# Event kinds, in the order they are processed at one instant: queues advance to the instant,
# then the minute that ends there closes, then the controller decides.
ADVANCE, MINUTE, DECIDE = 0, 1, 2
_BINS = np.concatenate([[0.0], np.logspace(-3, 3, 3001)])  # latency histogram edges (s)


@dataclass(frozen=True, slots=True)
class SimConfig:
    service: ServiceTime
    slo_s: float = 0.72
    quota: int = 32  # CPUs; one replica takes one
    cold_start_s: float = 10.0
    concurrency: int = 4
    queue: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        if self.slo_s <= self.service.mean:
            raise SpecError(f"--slo-ms: {self.slo_s * 1000:g} ms is not above the mean service "
                            f"time {self.service.mean * 1000:.0f} ms")
        if self.cold_start_s < 0:
            raise SpecError(f"--cold-start-s: {self.cold_start_s} must be >= 0")


@dataclass(slots=True)
class SimResult:
    policy: str
    jobs: tuple[str, ...]
    slo_violation_rate: float
    lost_utility: float
    p50_latency_s: float
    p99_latency_s: float
    requests: int
    dropped: int
    solver_ms_mean: float
    solver_ms_max: float
    satisfaction: np.ndarray  # (minutes, jobs) fraction of requests within the SLO
    utility: np.ndarray  # (minutes, jobs)
    tick_times: np.ndarray
    replicas: np.ndarray  # (ticks, jobs) target replicas after each tick
    wall_s: float
    reasons: list[str] = field(default_factory=list)

    def row(self) -> dict[str, object]:
        return {"policy": self.policy, "slo_violation_rate": self.slo_violation_rate,
                "lost_utility": self.lost_utility, "p50_latency_s": self.p50_latency_s,
                "p99_latency_s": self.p99_latency_s, "requests": self.requests,
                "dropped": self.dropped, "solver_ms_mean": self.solver_ms_mean,
                "solver_ms_max": self.solver_ms_max, "wall_s": self.wall_s}


class _Job:
    """One job's replicas and queue. `free` is a heap of the times each replica frees up."""

    __slots__ = ("admit_rng", "free", "rng", "starting", "waiting")

    def __init__(self, replicas: int, seed: int, j: int) -> None:
        self.free = [0.0] * replicas
        self.starting: list[float] = []  # ready times of replicas still cold-starting
        self.waiting: deque[float] = deque()  # start times of admitted requests not yet started
        self.rng = np.random.default_rng([seed, j, 0])
        self.admit_rng = np.random.default_rng([seed, j, 1])

    def scale(self, target: int, now: float, cold: float) -> None:
        self.starting = [t for t in self.starting if t > now]
        have = len(self.free)
        if target > have:
            for _ in range(target - have):
                heapq.heappush(self.free, now + cold)
                self.starting.append(now + cold)
        elif target < have:
            k = have - target
            cancel = sorted(self.starting)[len(self.starting) - min(k, len(self.starting)):]
            for t in cancel:
                self.free.remove(t)
                self.starting.remove(t)
            self.free.sort()
            del self.free[len(self.free) - (k - len(cancel)):]
            heapq.heapify(self.free)

    def run(self, arr: np.ndarray, svc: np.ndarray, admit: np.ndarray, cap: int) -> np.ndarray:
        """Advance the queue over these arrivals; returns latencies (inf = dropped)."""
        free, waiting = self.free, self.waiting
        lat = np.full(arr.size, np.inf)
        replace, pop = heapq.heapreplace, waiting.popleft
        for i, a in enumerate(arr.tolist()):
            while waiting and waiting[0] <= a:
                pop()
            if not admit[i] or len(waiting) >= cap:
                continue
            f = free[0]
            if f > a:
                waiting.append(f)
                a_start = f
            else:
                a_start = a
            done = a_start + svc[i]
            replace(free, done)
            lat[i] = done - a
        return lat

    def ongoing(self, now: float) -> int:
        busy = sum(1 for f in self.free if f > now) - sum(1 for t in self.starting if t > now)
        return sum(1 for s in self.waiting if s > now) + max(busy, 0)


def simulate(trace: CountTrace, policy: Policy, cfg: SimConfig) -> SimResult:
    """Replay `trace` under `policy`. Deterministic for a given seed."""
    t_wall = wallclock.perf_counter()
    n, minutes = len(trace.jobs), trace.minutes
    check_quota(n, cfg.quota)
    slo = np.full(n, cfg.slo_s)
    svc_mean = np.full(n, cfg.service.mean)
    replicas = fair_share(n, cfg.quota)
    jobs = [_Job(int(replicas[j]), cfg.seed, j) for j in range(n)]
    admit = np.ones(n)
    ctl = Controller(policy, n)
    counts = trace.counts
    arrived = np.zeros((minutes, n), np.int64)
    good = np.zeros((minutes, n), np.int64)
    dropped = np.zeros((minutes, n), np.int64)
    util = np.ones((minutes, n))
    hist = np.zeros(_BINS.size - 1, np.int64)
    tick_times: list[float] = []
    timeline: list[np.ndarray] = []
    heap: list[tuple[float, int, int]] = []
    seq = 0
    for m in range(1, minutes + 1):
        heapq.heappush(heap, (m * 60.0, MINUTE, seq))
        seq += 1
        for k in range(1, int(60 / TICK_S) + 1):
            for kind in (ADVANCE, DECIDE):
                heapq.heappush(heap, (m * 60.0 - 60.0 + k * TICK_S, kind, seq))
                seq += 1
    # Requests of the current minute, per job: arrival times, service times, admission draws.
    cur: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    minute_lat: list[list[np.ndarray]] = [[] for _ in range(n)]
    t_prev = 0.0

    def load_minute(m: int) -> None:
        cur.clear()
        for j, job in enumerate(jobs):
            if trace.arrivals is not None:  # the trace's own request times
                times = trace.arrivals[j]
                lo, hi = np.searchsorted(times, [m * 60.0, m * 60.0 + 60.0])
                arr, c = times[lo:hi], int(hi - lo)
            else:
                c = int(counts[m, j])
                arr = m * 60.0 + np.sort(job.rng.uniform(0.0, 60.0, c))
            cur.append((arr, cfg.service.sample(job.rng, c), job.admit_rng.random(c)))

    load_minute(0)
    win_arr = np.zeros(n, np.int64)
    win_p99 = np.zeros(n)
    while heap:
        now, kind, _ = heapq.heappop(heap)
        if kind == MINUTE:
            m = int(now // 60) - 1
            for j in range(n):
                lat = np.concatenate(minute_lat[j]) if minute_lat[j] else np.empty(0)
                minute_lat[j] = []
                ok = lat[np.isfinite(lat)]
                arrived[m, j] = lat.size
                good[m, j] = int(np.count_nonzero(ok <= cfg.slo_s))
                dropped[m, j] = lat.size - ok.size
                if lat.size:
                    p99 = float(np.percentile(ok, 99)) if ok.size else np.inf
                    u = relaxed_utility(np.array(p99), np.array(cfg.slo_s)) if ok.size else 0.0
                    util[m, j] = float(u) * (1.0 - float(drop_penalty(dropped[m, j] / lat.size)))
                hist += np.histogram(ok, _BINS)[0]
            if m + 1 < minutes:
                load_minute(m + 1)
            continue
        if kind == ADVANCE:  # run every queue up to `now`
            win_arr = np.zeros(n, np.int64)
            win_p99 = np.zeros(n)
            for j, job in enumerate(jobs):
                arr, svc, draw = cur[j]
                lo, hi = np.searchsorted(arr, [t_prev, now], side="left")
                cap = cfg.queue + (cfg.concurrency - 1) * len(job.free)
                admitted = draw[lo:hi] < admit[j]
                lat = job.run(arr[lo:hi], svc[lo:hi], admitted, cap)
                minute_lat[j].append(lat)
                win_arr[j] = lat.size
                # Requests shed on purpose by admission control are not a sign of overload.
                seen = lat[admitted]
                if seen.size:
                    win_p99[j] = float(np.percentile(np.minimum(seen, 10 * cfg.slo_s), 99))
            t_prev = now
            continue
        # DECIDE: the controller sees the window that just ended.
        ready = np.array([len(jb.free) - sum(1 for t in jb.starting if t > now) for jb in jobs])
        snap = Snapshot(now, trace.jobs, slo, svc_mean, cfg.quota, replicas.copy(), ready,
                        counts[: int(now // 60)].T, TICK_S, win_arr, win_p99,
                        np.array([jb.ongoing(now) for jb in jobs]))
        decision = ctl.step(snap)
        if decision is not None:
            for j, job in enumerate(jobs):
                if decision.replicas[j] != replicas[j]:
                    job.scale(int(decision.replicas[j]), now, cfg.cold_start_s)
            replicas = np.asarray(decision.replicas, np.int64).copy()
            admit = np.asarray(decision.admit, float)
        tick_times.append(now)
        timeline.append(replicas.copy())

    sat = np.where(arrived > 0, good / np.maximum(arrived, 1), 1.0)
    total = int(arrived.sum())
    cdf = np.cumsum(hist) / max(int(hist.sum()), 1)
    p50 = float(_BINS[1:][np.searchsorted(cdf, 0.5)]) if hist.sum() else 0.0
    p99 = float(_BINS[1:][np.searchsorted(cdf, 0.99)]) if hist.sum() else 0.0
    sms = ctl.solver_ms
    return SimResult(policy.name, trace.jobs, float(1.0 - sat.mean(axis=1).mean()),
                     float(n - util.sum(axis=1).mean()), p50, p99, total, int(dropped.sum()),
                     float(np.mean(sms)) if sms else 0.0, float(np.max(sms)) if sms else 0.0,
                     sat, util, np.asarray(tick_times), np.asarray(timeline),
                     wallclock.perf_counter() - t_wall, [e.reason for e in ctl.log][-50:])

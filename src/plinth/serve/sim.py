"""Replay a per-minute request trace against the autoscaling policies, in virtual time.

What the replay models, and the options that change it (`SimConfig`; each run records them):

- Arrivals (`arrivals`). `uniform`: each minute's count, at times drawn uniformly at random in the
  minute (a Poisson process conditioned on the count). `poisson`: a Poisson process at the
  minute's rate, so the count itself varies (its expectation is the trace's count). A trace with
  request timestamps, like the Azure LLM trace, is replayed at its own times in either case.
- Service time: a lognormal fit on one replica (1 CPU, one request at a time).
- Queueing (`queueing`). `router` (the default) is the platform's router
  (`plinth.serve.router`): each request goes to the replica with the fewest requests in flight,
  never more than `concurrency` (4) per replica; a replica serves its own requests one at a time,
  in order, so a request can wait behind three others while another replica idles. When every
  replica is full the request waits in the job's router queue (at most `queue`, 50; a request
  that finds it full is dropped) and goes to the first replica that frees a slot.
  `round-robin` is Faro's router: the same, but the next replica in a cycle that has a free slot.
  `fifo` is one central queue feeding whichever replica frees first (50 + 3·replicas waiting).
- Replicas: a new one serves only after `cold_start_s`, by default the measured cold start of a
  real replica (`COLD_START_S`: process start plus model load, see bench/serve_cold_start.py);
  Faro's simulator uses 35 s. Scaling down removes starting replicas first, then the newest; a
  removed replica finishes the requests it holds.
- Start (`initial_replicas`): by default each job starts with its fair share of the quota, as
  in Faro's experiments; a number k starts each job at k replicas, ready, as the platform starts
  a service at its `min_replicas`.
- Hops (`hop_s`): a request's time outside its replica and the router's queue (the HTTP hops
  from the sender to the router to the replica and back, and the processes' own handling), in
  the replay's seconds. By default none. Given samples measured on the real path (each answer's
  Server-Timing against its latency, see bench/serve_real.py), each request adds one drawn at
  random; a hop holds no replica.
- Time compression (`compress` = c): the real serving path replays one trace minute in 60/c s,
  with service times, SLO and control periods all divided by c, but a replica still takes its
  real cold start. The replay is then the same as the uncompressed one with a cold start c times
  longer, which is how it is simulated; latencies are reported in the compressed replay's seconds.

Control events sit on a heap of (time, kind, sequence), as in `plinth.sim.engine`, so ties break
the same way on every run: at one instant the minute closes before the controller ticks. Between
ticks each job's queue is advanced request by request. The arrivals and service times come from
one rng stream per job, so every policy sees exactly the same requests for a given seed.

Policies see, at each tick, the last window's arrivals and the p99 and mean latency of the
requests that arrived in it (a request dropped by a full queue counts as 10 × SLO; one shed by
admission control is left out), and the requests in the system now. In the metrics every
dropped request, shed or not, is an SLO violation.
"""

from __future__ import annotations

import heapq
import json
import math
import time as wallclock
from bisect import bisect_right
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
QUEUEING = ("router", "round-robin", "fifo")
ARRIVALS = ("uniform", "poisson")
# A real replica's cold start (s): `python -m plinth.serve.replica --model tiny-cnn` from Popen to
# its first /healthz 200, median of 5 runs on the 2-CPU development machine (load average 1.8),
# 2026-12-01: 3.4-4.0 s. The replica with batching committed since used 3.8-4.0 s of CPU to
# its first 200 (its wall time on a saturated machine was 61-78 s). Re-measure with
# `python bench/serve_cold_start.py`.
COLD_START_S = 3.6
FARO_COLD_START_S = 35.0  # Faro's simulator: a new pod (cold_start_overhead_s)


@dataclass(frozen=True, slots=True)
class SimConfig:
    service: ServiceTime
    slo_s: float = 0.72
    quota: int = 32  # CPUs; one replica takes one
    cold_start_s: float = COLD_START_S
    concurrency: int = 4
    queue: int = 50
    queueing: str = "router"
    arrivals: str = "uniform"
    compress: float = 1.0
    seed: int = 0
    hop_s: tuple[float, ...] = ()  # measured hop times to draw from, in the replay's seconds
    initial_replicas: int | None = None  # per job at the start; None: the fair share

    def __post_init__(self) -> None:
        if self.initial_replicas is not None and self.initial_replicas < 1:
            raise SpecError(f"--initial-replicas: {self.initial_replicas} must be >= 1")
        if not all(math.isfinite(h) and h >= 0 for h in self.hop_s):
            raise SpecError("--hop: every hop time must be a finite number of seconds >= 0")
        if self.slo_s <= self.service.mean:
            raise SpecError(f"--slo-ms: {self.slo_s * 1000:g} ms is not above the mean service "
                            f"time {self.service.mean * 1000:.0f} ms")
        if self.cold_start_s < 0:
            raise SpecError(f"--cold-start-s: {self.cold_start_s} must be >= 0")
        if self.queueing not in QUEUEING:
            raise SpecError(f"--queueing: {self.queueing!r} is not one of {', '.join(QUEUEING)}")
        if self.arrivals not in ARRIVALS:
            raise SpecError(f"--arrivals: {self.arrivals!r} is not one of {', '.join(ARRIVALS)}")
        if not self.compress >= 1.0:
            raise SpecError(f"--compress: {self.compress} must be >= 1 (1 = real time)")
        if self.concurrency < 1:
            raise SpecError(f"concurrency: {self.concurrency} must be >= 1")

    def label(self) -> dict[str, object]:
        """What a result was measured with, for tables and JSON."""
        d = asdict(self)
        d["service"] = (f"{self.service.kind}(shape={self.service.shape:g}, "
                        f"loc={self.service.loc:g}, scale={self.service.scale:g})")
        h = np.asarray(self.hop_s)
        d["hop_s"] = (f"{h.size} samples: median {np.median(h) * 1000:.1f} ms, p99 "
                      f"{np.percentile(h, 99) * 1000:.1f} ms" if h.size else "none")
        return d


def load_hops(path: str) -> tuple[float, ...]:
    """Hop times (s) measured on the real path: a JSON list of seconds, or an object whose
    "hop_s" is one (what bench/serve_real.py --hop-out writes)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise SpecError(f"--hop: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SpecError(f"--hop: {path} is not JSON: {e}") from None
    hops = doc.get("hop_s") if isinstance(doc, dict) else doc
    if not isinstance(hops, list) or not hops or not all(
            isinstance(h, int | float) and not isinstance(h, bool) for h in hops):
        raise SpecError(f"--hop: {path} must hold a non-empty list of seconds (or "
                        f'{{"hop_s": [...]}})')
    return tuple(float(h) for h in hops)


@dataclass(slots=True)
class SimResult:
    policy: str
    jobs: tuple[str, ...]
    slo_violation_rate: float  # 1 - the mean over minutes of the jobs' mean satisfaction (Faro's)
    request_violation_rate: float  # the share of all requests late or dropped
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

    def replicas_added(self) -> int:
        """Replicas started over the replay (each one a cold start)."""
        return int(np.clip(np.diff(self.replicas, axis=0), 0, None).sum())

    def row(self) -> dict[str, object]:
        return {"policy": self.policy, "slo_violation_rate": self.slo_violation_rate,
                "request_violation_rate": self.request_violation_rate,
                "lost_utility": self.lost_utility, "p50_latency_s": self.p50_latency_s,
                "p99_latency_s": self.p99_latency_s, "requests": self.requests,
                "dropped": self.dropped, "replicas_added": self.replicas_added(),
                "solver_ms_mean": self.solver_ms_mean,
                "solver_ms_max": self.solver_ms_max, "wall_s": self.wall_s}


class _Fifo:
    """One job's replicas behind one central FIFO. `free` is a heap of the times each replica
    frees up."""

    __slots__ = ("free", "starting", "waiting")

    def __init__(self, replicas: int) -> None:
        self.free = [0.0] * replicas
        self.starting: list[float] = []  # ready times of replicas still cold-starting
        self.waiting: deque[float] = deque()  # start times of admitted requests not yet started

    def size(self) -> int:
        return len(self.free)

    def ready(self, now: float) -> int:
        return len(self.free) - sum(1 for t in self.starting if t > now)

    def cap(self, queue: int, concurrency: int) -> int:
        return queue + (concurrency - 1) * len(self.free)

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


class _Router:
    """One job's replicas behind the router: per-replica queues of at most `cc` in flight.

    A replica serves its requests in order, one at a time, so the finish time of a request is
    fixed when it is sent: max(when it is sent, the replica's last finish) + its service time.
    `fin[k]` keeps replica k's last `cc` finish times; it has a free slot at time t when fewer
    than `cc` of them are after t, i.e. from fin[k][0] on once it holds `cc`.
    """

    __slots__ = ("cc", "fin", "gone", "least", "rdy", "rr", "waiting")

    def __init__(self, replicas: int, cc: int, least: bool) -> None:
        self.cc, self.least, self.rr = cc, least, 0
        self.rdy = [0.0] * replicas  # when each replica starts to serve
        self.fin: list[deque[float]] = [deque(maxlen=cc) for _ in range(replicas)]
        self.gone: list[deque[float]] = []  # removed replicas, finishing what they hold
        self.waiting: deque[float] = deque()  # send times of requests in the router queue

    def size(self) -> int:
        return len(self.rdy)

    def ready(self, now: float) -> int:
        return sum(1 for t in self.rdy if t <= now)

    def cap(self, queue: int, concurrency: int) -> int:
        return queue

    def scale(self, target: int, now: float, cold: float) -> None:
        have = len(self.rdy)
        if target > have:
            self.rdy += [now + cold] * (target - have)
            self.fin += [deque(maxlen=self.cc) for _ in range(target - have)]
            return
        # Starting replicas go first (the latest to be ready first), then the newest.
        order = sorted(range(have), key=lambda k: (self.rdy[k] <= now, -self.rdy[k], -k))
        drop = set(order[: have - target])
        self.gone = [f for f in self.gone if f and f[-1] > now]
        self.gone += [self.fin[k] for k in drop if self.rdy[k] <= now]
        keep = [k for k in range(have) if k not in drop]
        self.rdy = [self.rdy[k] for k in keep]
        self.fin = [self.fin[k] for k in keep]
        self.rr = self.rr % max(len(keep), 1)

    def run(self, arr: np.ndarray, svc: np.ndarray, admit: np.ndarray, cap: int) -> np.ndarray:
        """Advance the queues over these arrivals; returns latencies (inf = dropped)."""
        rdy, fin, waiting, cc, least = self.rdy, self.fin, self.waiting, self.cc, self.least
        n, rr = len(rdy), self.rr
        cycle = list(range(n)) * 2  # cycle[rr:rr + n]: the replicas in round-robin order from rr
        lat = np.full(arr.size, np.inf)
        pop, inf = waiting.popleft, float("inf")
        for i, a in enumerate(arr.tolist()):
            while waiting and waiting[0] <= a:
                pop()
            if not admit[i] or len(waiting) >= cap:
                continue
            pick, first, t, soonest, best = -1, 0, a, inf, cc
            for k in (range(n) if least else cycle[rr:rr + n]):
                f = fin[k]
                if rdy[k] > a:  # still starting; a slot frees when it starts, or later if full
                    av = rdy[k] if len(f) < cc else max(rdy[k], f[0])
                    if av < soonest:
                        soonest, first = av, k
                    continue
                if not f or f[-1] <= a:  # idle: nothing has fewer in flight
                    pick = k
                    break
                busy = len(f) - bisect_right(f, a)  # in flight at a
                if busy < best:
                    pick, best = k, busy
                    if not least:  # round-robin: the first one in the cycle with a free slot
                        break
                elif busy == cc and f[0] < soonest:
                    soonest, first = f[0], k
            if pick < 0:  # every replica is full: wait in the router queue for the first slot
                pick, t = first, soonest
                waiting.append(t)
            if not least:
                rr = (pick + 1) % n
            f = fin[pick]
            start = f[-1] if f and f[-1] > t else t
            done = start + svc[i]
            f.append(done)
            lat[i] = done - a
        self.rr = rr
        return lat

    def ongoing(self, now: float) -> int:
        held = sum(sum(1 for x in f if x > now) for f in self.fin + self.gone)
        return sum(1 for s in self.waiting if s > now) + held


def _arrivals(kind: str, rng: np.random.Generator, count: int, m: int) -> np.ndarray:
    """Arrival times of minute m's requests (seconds from the start), sorted."""
    c = int(rng.poisson(count)) if kind == "poisson" else count
    return m * 60.0 + np.sort(rng.uniform(0.0, 60.0, c))


def simulate(trace: CountTrace, policy: Policy, cfg: SimConfig) -> SimResult:
    """Replay `trace` under `policy`. Deterministic for a given seed."""
    t_wall = wallclock.perf_counter()
    n, minutes = len(trace.jobs), trace.minutes
    check_quota(n, cfg.quota)
    slo = np.full(n, cfg.slo_s)
    svc_mean = np.full(n, cfg.service.mean)
    if cfg.initial_replicas is None:
        replicas = fair_share(n, cfg.quota)
    elif cfg.initial_replicas * n > cfg.quota:
        raise SpecError(f"--initial-replicas: {cfg.initial_replicas} for each of {n} jobs is "
                        f"more than the quota of {cfg.quota}")
    else:
        replicas = np.full(n, cfg.initial_replicas, np.int64)
    jobs: list[_Fifo | _Router] = [
        _Fifo(int(r)) if cfg.queueing == "fifo" else
        _Router(int(r), cfg.concurrency, least=cfg.queueing == "router") for r in replicas]
    rngs = [np.random.default_rng([cfg.seed, j, 0]) for j in range(n)]
    admit_rngs = [np.random.default_rng([cfg.seed, j, 1]) for j in range(n)]
    hop_rngs = [np.random.default_rng([cfg.seed, j, 2]) for j in range(n)]
    hops = np.asarray(cfg.hop_s, float) * cfg.compress  # in trace time
    cold = cfg.cold_start_s * cfg.compress  # in trace time
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
    # Requests of the current minute, per job: arrival times, service times, admission draws,
    # hop times.
    cur: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
    minute_lat: list[list[np.ndarray]] = [[] for _ in range(n)]
    t_prev = 0.0

    def load_minute(m: int) -> None:
        cur.clear()
        for j in range(n):
            if trace.arrivals is not None:  # the trace's own request times
                times = trace.arrivals[j]
                lo, hi = np.searchsorted(times, [m * 60.0, m * 60.0 + 60.0])
                arr = times[lo:hi]
            else:
                arr = _arrivals(cfg.arrivals, rngs[j], int(counts[m, j]), m)
            c = arr.size
            hop = hops[hop_rngs[j].integers(hops.size, size=c)] if hops.size else None
            cur.append((arr, cfg.service.sample(rngs[j], c), admit_rngs[j].random(c), hop))

    load_minute(0)
    win_arr = np.zeros(n, np.int64)
    win_p99 = np.zeros(n)
    win_mean = np.zeros(n)
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
            win_mean = np.zeros(n)
            for j, job in enumerate(jobs):
                arr, svc, draw, hop = cur[j]
                lo, hi = np.searchsorted(arr, [t_prev, now], side="left")
                cap = job.cap(cfg.queue, cfg.concurrency)
                admitted = draw[lo:hi] < admit[j]
                lat = job.run(arr[lo:hi], svc[lo:hi], admitted, cap)
                if hop is not None:
                    lat += hop[lo:hi]  # (a dropped request's inf stays inf)
                minute_lat[j].append(lat)
                win_arr[j] = lat.size
                # Requests shed on purpose by admission control are not a sign of overload.
                seen = lat[admitted]
                if seen.size:
                    capped = np.minimum(seen, 10 * cfg.slo_s)
                    win_p99[j] = float(np.percentile(capped, 99))
                    win_mean[j] = float(capped.mean())
            t_prev = now
            continue
        # DECIDE: the controller sees the window that just ended.
        ready = np.array([jb.ready(now) for jb in jobs])
        snap = Snapshot(now, trace.jobs, slo, svc_mean, cfg.quota, replicas.copy(), ready,
                        counts[: int(now // 60)].T, TICK_S, win_arr, win_p99,
                        np.array([jb.ongoing(now) for jb in jobs]), win_mean)
        decision = ctl.step(snap)
        if decision is not None:
            for j, job in enumerate(jobs):
                if decision.replicas[j] != replicas[j]:
                    job.scale(int(decision.replicas[j]), now, cold)
            replicas = np.asarray(decision.replicas, np.int64).copy()
            admit = np.asarray(decision.admit, float)
        tick_times.append(now)
        timeline.append(replicas.copy())

    sat = np.where(arrived > 0, good / np.maximum(arrived, 1), 1.0)
    total = int(arrived.sum())
    cdf = np.cumsum(hist) / max(int(hist.sum()), 1)
    # Latencies in the replay's own seconds (a compressed replay's are c times shorter).
    p50 = float(_BINS[1:][np.searchsorted(cdf, 0.5)]) / cfg.compress if hist.sum() else 0.0
    p99 = float(_BINS[1:][np.searchsorted(cdf, 0.99)]) / cfg.compress if hist.sum() else 0.0
    sms = ctl.solver_ms
    return SimResult(policy.name, trace.jobs, float(1.0 - sat.mean(axis=1).mean()),
                     float(1.0 - good.sum() / total) if total else 0.0,
                     float(n - util.sum(axis=1).mean()), p50, p99, total, int(dropped.sum()),
                     float(np.mean(sms)) if sms else 0.0, float(np.max(sms)) if sms else 0.0,
                     sat, util, np.asarray(tick_times), np.asarray(timeline),
                     wallclock.perf_counter() - t_wall, [e.reason for e in ctl.log][-50:])

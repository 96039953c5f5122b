"""Services as platform workloads: the Service kind's controller.

A Service's units are its router, `router`, and its replicas, `replica-0..N-1`: each an
ordinary job that the scheduler places and the runtime starts, with the service's tenant and
quota. The router (`python -m plinth.serve.router`) listens on its node's address and reports
it (`plinth.serve.reports.RouterReport`); the service's address is then
`http://ROUTER/v1/NAME/infer`, kept in its status, which `plinth show SERVICE` prints. Replicas
(`python -m plinth.serve.replica`, with the spec's resources and isolation) join that router by
themselves with the service's secret, so they are started only once its address is known; a
router that is replaced (its job ended, its node lost) takes its replicas with it, and they are
started again to join the new one.

One router per service, not one per host nor one for the platform: a tenant's traffic passes
through no process of another tenant's (the router runs as the service's tenant, in its quota);
a router that fails or is overloaded stops one service, not all; it scales and is placed with
its own service; and its address is a single, stable one for the service's life, not one per
host that clients would have to choose between.

Nothing on the request path goes through the control plane: when it stops (or is killed), the
router and the replicas go on answering, and a control plane started again adopts them as any
job (`plinth.control.recovery`).

N is the service's `desired` count, which the autoscaler sets: every `tick_s` it reads each
service's arrivals and latencies from its router's latest report, and one policy
(`faro-fairsum` by default, the serving simulator's own `plinth.serve.controller.Controller`)
decides for all services at once, within the capacity the cluster has for them. Its decision
and the reason are kept in each service's status.

Who preempts whom: replicas are not preemptible unless the spec says so, so a training job
never takes a serving replica's place; a replica that waits may preempt lower-priority,
preemptible jobs as any job may under the scheduler's policy.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec, Resources
from plinth.core.kinds import BaseController, Context, Observed, Unit, Workload
from plinth.serve.controller import Controller
from plinth.serve.policies import make_policy
from plinth.serve.reports import ReplicaReport, RouterReport
from plinth.serve.spec import SECRET_ENV, ServiceSpec
from plinth.serve.types import Snapshot

log = logging.getLogger("plinth.serve")
TIMELINE = 360  # ticks of (desired, ready) kept for the dashboard
DECISIONS = 10  # the autoscaler's last decisions kept in a service's status
ROUTER = "router"  # the router's unit
ROUTER_MEMORY_MIB = 512
REPORT_S = 1.0  # how often a router reports (more often when the autoscaler ticks faster)


@dataclass(frozen=True, slots=True)
class Window:
    """What happened to one service between two ticks of the autoscaler."""

    arrivals: int
    p99_s: float
    ongoing: int
    ready: int
    ok: int = 0  # answered 200 in the window
    within_slo: int = 0  # of those, within the service's SLO
    service_ms: float | None = None  # the mean of its replicas' measured times
    mean_s: float = 0.0  # mean latency of the requests answered in the window


@dataclass(slots=True)
class _Live:
    """What the autoscaler remembers of one service between ticks (not stored: it is rebuilt
    from the router's reports within a minute after a restart)."""

    history: list[int] = field(default_factory=list)  # arrivals per complete minute
    minute_count: int = 0
    arrivals: int = 0  # since the service started (for SLO attainment)
    within_slo: int = 0
    answered: int = 0
    report: RouterReport | None = None  # its router's latest
    # The router's counters at the last tick; None after a restart of the control plane
    # until its first report is seen (what came before is not counted again).
    base: tuple[int, int, int, int, float] | None = (0, 0, 0, 0, 0.0)
    window: Window | None = None
    timeline: deque = field(default_factory=lambda: deque(maxlen=TIMELINE))  # (t, desired, ready)

    def take_window(self, timeout_s: float) -> Window | None:
        """The window since the last tick, from the router's latest report."""
        r = self.report
        if r is None:
            return None
        now = (r.arrivals, r.ok, r.within_slo, r.rejected, r.latency_s)
        base = self.base or now
        if any(x < y for x, y in zip(now, base)):  # a new router: it counts from zero
            base = (0, 0, 0, 0, 0.0)
        self.base = now
        arrivals, ok, within, rejected, latency = (x - y for x, y in zip(now, base))
        # A 503 or 504 in the window counts as a violation of any SLO.
        p99 = max(r.p99_s, timeout_s) if rejected > 0 else r.p99_s
        return Window(int(arrivals), p99, r.ongoing, r.ready, int(ok), int(within),
                      r.service_ms, latency / ok if ok else 0.0)


class ServiceController(BaseController):
    """The Service kind's controller: its router and replica units, and the autoscaler."""

    kind = "Service"

    def __init__(self, *, policy: str = "faro-fairsum", tick_s: float = 10.0,
                 minute_s: float = 60.0, capacity_cpus: float = 0.0) -> None:
        """`minute_s`: wall seconds that count as one minute of arrivals history (60; less
        for a time-compressed replay). `capacity_cpus`: CPUs the services may use in all."""
        self.policy_name, self.tick_s, self.minute_s = policy, tick_s, minute_s
        self.capacity_cpus = capacity_cpus
        self._live: dict[int, _Live] = {}
        self._order: tuple[int, ...] = ()
        self._controller: Controller | None = None
        self._next_tick = 0.0
        self._t0: float | None = None
        self._minute = 0

    def start(self, w: Workload, ctx: Context) -> None:
        """A service is submitted, or found again after a restart (its router's address, if
        it had one, is in its status: the router runs on)."""
        live = self._live.setdefault(w.id, _Live())
        if ctx.recovered:
            live.base = None
        w.status.setdefault("desired", w.spec.min_replicas)
        w.status["slo_ms"] = w.spec.slo_ms
        if w.spec.tuned:
            w.status.setdefault("tuned", "no replica has reported yet")

    def end(self, w: Workload, ctx: Context) -> None:
        self._live.pop(w.id, None)

    def unit_ended(self, w: Workload, unit: str, ctx: Context) -> None:
        """Its router has ended: its address is gone, and so are the replicas that joined it
        (`units` stops wanting them until a new router reports)."""
        if unit == ROUTER:
            w.status.pop("router", None)
            w.status.pop("url", None)
            live = self._live.setdefault(w.id, _Live())
            live.report, live.base = None, (0, 0, 0, 0, 0.0)

    def report_model(self, w: Workload, unit: str) -> type[BaseModel] | None:
        if unit == ROUTER:
            return RouterReport
        return ReplicaReport if unit.startswith("replica-") else None

    def report(self, w: Workload, unit: str, body: BaseModel, ctx: Context) -> bool:
        """The router's counters and address (the status changes when its address does), or a
        replica that has loaded a tuned model, which records it runs."""
        if isinstance(body, RouterReport):
            self._live.setdefault(w.id, _Live()).report = body
            if w.status.get("router") == body.url:
                return False
            w.status.update(router=body.url, url=f"{body.url}/v1/{w.name}/infer")
            return True
        tuned = getattr(body, "tuned", None)
        if tuned is None or w.status.get("tuned") == tuned:
            return False
        w.status["tuned"] = tuned
        return True

    def check(self, w: Workload, ctx: Context) -> None:
        """Refuse, in one line, a service whose router and replica set could never fit the
        cluster."""
        s: ServiceSpec = w.spec
        cluster_cpus, cluster_gpus = ctx.capacity().cpus, ctx.capacity().gpus
        need = s.max_replicas * s.resources.cpus + s.router.cpus
        if need > cluster_cpus:
            raise SpecError(f"max_replicas: {s.max_replicas} replicas of "
                            f"{s.resources.cpus:g} CPUs and a router of {s.router.cpus:g} need "
                            f"{need:g} CPUs; the cluster has {cluster_cpus:g}")
        shares = s.max_replicas * (s.resources.gpu_fraction or 0)
        if shares > cluster_gpus:
            raise SpecError(f"max_replicas: {s.max_replicas} replicas of gpu_fraction "
                            f"{s.resources.gpu_fraction:g} need {shares:g} GPUs; the cluster "
                            f"has {cluster_gpus}")
        ctx.fits(self.replica_spec(w, 0, "http://router.invalid"))  # started later

    # --- units ------------------------------------------------------------------------------

    def units(self, w: Workload, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        out = [Unit(ROUTER, self.router_spec(w))]
        router = w.status.get("router")
        if router is None:  # replicas join their router: they wait for its address
            return out
        n = int(w.status.get("desired", w.spec.min_replicas))
        return out + [Unit(f"replica-{i}", self.replica_spec(w, i, router)) for i in range(n)]

    def router_spec(self, w: Workload) -> JobSpec:
        s: ServiceSpec = w.spec
        r = s.router
        command = [sys.executable, "-m", "plinth.serve.router", "--service", w.name,
                   "--slo-ms", f"{s.slo_ms:g}", "--queue", str(r.queue),
                   "--concurrency", str(r.concurrency), "--timeout-s", f"{r.timeout_s:g}",
                   "--window-s", f"{self.tick_s:g}",
                   "--report-s", f"{min(REPORT_S, self.tick_s):g}"]
        return JobSpec(name=f"{w.name}.{ROUTER}", tenant=w.tenant, command=command,
                       env={SECRET_ENV: w.secret},
                       resources=Resources(cpus=r.cpus, memory=ROUTER_MEMORY_MIB),
                       priority=s.priority, preemptible=s.preemptible)

    def replica_spec(self, w: Workload, i: int, router: str) -> JobSpec:
        s: ServiceSpec = w.spec
        unit = f"replica-{i}"
        command = [sys.executable, "-m", "plinth.serve.replica", "--model", s.model,
                   "--input-shape", ",".join(map(str, s.input_shape)), "--slo-ms", f"{s.slo_ms:g}",
                   "--max-batch", str(s.batching.max_batch),
                   "--max-wait-ms", f"{s.batching.max_wait_ms:g}", "--port", "0",
                   "--register", f"{router}/_plinth/replicas/{w.name}", "--unit", unit]
        if s.handler:
            command += ["--handler", s.handler]
        if s.workdir:
            command += ["--workdir", s.workdir]
        if s.tuned:
            command += ["--tuned-db", s.tuned.db, "--tuned-target", s.tuned.target]
        return JobSpec(name=f"{w.name}.{unit}", tenant=w.tenant, command=command,
                       env={**s.env, SECRET_ENV: w.secret,
                            "OMP_NUM_THREADS": str(s.threads())},
                       workdir=s.workdir, resources=s.resources, priority=s.priority,
                       preemptible=s.preemptible)

    # --- the autoscaler ---------------------------------------------------------------------

    def tick(self, ws: list[Workload], ctx: Context) -> list[Workload]:
        """Every `tick_s`: read the routers' latest reports, decide for every service at once,
        and return the services whose desired replica count changed."""
        now = ctx.now()
        if not ws or now < self._next_tick:
            return []
        self._next_tick = now + self.tick_s
        windows = {}
        for w in ws:
            win = self._live.setdefault(w.id, _Live()).take_window(w.spec.router.timeout_s)
            if win is not None:
                windows[w.id] = win
        if self._t0 is None and any(win.arrivals for win in windows.values()):
            # The minutes of history start with the first traffic (this window's): counted
            # from the services' submission, the minutes before their clients tell nothing,
            # and the first minute with traffic would be a part of one, seen late.
            self._t0 = now - self.tick_s
        order = tuple(w.id for w in ws)
        if order != self._order:  # services came or went: the policy starts afresh
            self._order = order
            self._controller = Controller(make_policy(self.policy_name), len(ws))
        minute = int((now - self._t0) // self.minute_s) if self._t0 is not None else 0
        close = minute > self._minute
        self._minute = minute
        for w in ws:
            live = self._live[w.id]
            live.window = win = windows.get(w.id)  # None: its router has not reported
            if win is not None:
                live.minute_count += win.arrivals
                live.arrivals += win.arrivals
                live.answered += win.ok
                live.within_slo += win.within_slo
            if close:
                live.history.append(live.minute_count)
                live.minute_count = 0
        snap = self._snapshot(ws, now)
        assert self._controller is not None
        decision = self._controller.step(snap)
        changed = []
        for j, w in enumerate(ws):
            live = self._live[w.id]
            win = live.window
            desired = int(w.status.get("desired", w.spec.min_replicas))
            if decision is not None:
                want = int(np.clip(decision.replicas[j], w.spec.min_replicas,
                                   w.spec.max_replicas))
                if want != desired:
                    w.status["reason"] = decision.reason
                    w.status["decided_at"] = now
                    w.status["decisions"] = [*w.status.get("decisions", []), {
                        "at": now, "from": desired, "to": want,
                        "reason": decision.reason}][-DECISIONS:]
                    desired = want
                    changed.append(w)
            live.timeline.append((now, desired, win.ready if win else 0))
            w.status.update(
                desired=desired, ready=win.ready if win else 0,
                rate_rps=round(win.arrivals / self.tick_s, 3) if win else 0.0,
                p99_ms=round(win.p99_s * 1000, 2) if win else 0.0,
                slo_attainment=(round(live.within_slo / live.arrivals, 4) if live.arrivals
                                else None),
                predicted_rps=round(self._predicted(live), 3),
                service_ms=round(float(snap.service_s[j]) * 1000 * self.minute_s / 60, 3))
        return changed

    def timeline(self, workload_id: int) -> list[tuple[float, int, int]]:
        """(time, desired, ready) at each tick, oldest first, for the dashboard."""
        live = self._live.get(workload_id)
        return list(live.timeline) if live is not None else []

    def _snapshot(self, services: list[Workload], now: float) -> Snapshot:
        n = len(services)
        lives = [self._live[w.id] for w in services]
        wins = [lv.window or Window(0, 0.0, 0, 0) for lv in lives]
        depth = min(len(lv.history) for lv in lives)
        hist = (np.array([lv.history[len(lv.history) - depth:] for lv in lives], np.int64)
                if depth else np.zeros((n, 0), np.int64))
        service_s = np.array([(w.spec.service_ms or win.service_ms or w.spec.slo_ms / 4) / 1000
                              for w, win in zip(services, wins)])
        per_replica = max(float(np.mean([w.spec.resources.cpus for w in services])), 1e-3)
        routers = sum(w.spec.router.cpus for w in services)  # theirs are not replicas' CPUs
        cap = (int(max(self.capacity_cpus - routers, 0) // per_replica) if self.capacity_cpus
               else 10**6)
        quota = max(n, min(sum(w.spec.max_replicas for w in services), cap))
        # Policies think in the trace's time: with minute_s < 60 a wall second is `scale`
        # trace seconds, and every duration they see is scaled up to match.
        scale = 60.0 / self.minute_s
        return Snapshot(
            now=(now - (self._t0 or now)) * scale, jobs=tuple(w.name for w in services),
            slo_s=np.array([w.spec.slo_ms / 1000 for w in services]) * scale,
            service_s=service_s * scale,
            quota=quota,
            replicas=np.array([int(w.status.get("desired", w.spec.min_replicas))
                               for w in services], np.int64),
            ready=np.array([win.ready for win in wins], np.int64), history=hist,
            window_s=self.tick_s * scale,
            window_arrivals=np.array([win.arrivals for win in wins], np.int64),
            window_p99_s=np.array([win.p99_s for win in wins]) * scale,
            window_mean_s=np.array([win.mean_s for win in wins]) * scale,
            ongoing=np.array([win.ongoing for win in wins], np.int64))

    def _predicted(self, live: _Live) -> float:
        """The next minute's expected arrivals per second (Holt, the median), else the last
        minute's rate."""
        if len(live.history) >= 3:
            from plinth.serve.predict import HoltForecaster

            fc = HoltForecaster().quantiles(np.array([live.history], np.int64), [0.5])
            return float(fc[0, 0, 0]) / self.minute_s
        return (live.history[-1] if live.history else live.minute_count) / self.minute_s

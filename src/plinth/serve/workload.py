"""Services as platform workloads: the Service kind's controller.

A Service's units are its replicas, `replica-0..N-1`, each an ordinary job that the scheduler
places and the runtime starts (`python -m plinth.serve.replica`), with the spec's resources,
tenant, quota and isolation. N is the service's `desired` count, which the autoscaler sets:
every `tick_s` it reads each service's arrivals and latencies from the router, and one policy
(`faro-fairsum` by default, the serving simulator's own `plinth.serve.controller.Controller`)
decides for all services at once, within the capacity the cluster has for them. Its decision
and the reason are kept in each service's status, which `plinth show SERVICE` prints.

The router runs in the control plane on one fixed address; a service is reached at
`http://HOST:PORT/v1/NAME/infer` for as long as it exists, across restarts. Replicas join it by
themselves with the service's secret (see `plinth.serve.router`).

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
from plinth.core.jobspec import JobSpec
from plinth.core.kinds import BaseController, Context, Observed, Unit, Workload
from plinth.core.net import free_port
from plinth.serve.controller import Controller
from plinth.serve.policies import make_policy
from plinth.serve.reports import ReplicaReport
from plinth.serve.router import Router, RouterServer, Window
from plinth.serve.spec import RouterSpec, ServiceSpec
from plinth.serve.types import Snapshot

log = logging.getLogger("plinth.serve")
TIMELINE = 360  # ticks of (desired, ready) kept for the dashboard
DECISIONS = 10  # the autoscaler's last decisions kept in a service's status


@dataclass(slots=True)
class _Live:
    """What the autoscaler remembers of one service between ticks (not stored: it is rebuilt
    from the router within a minute after a restart)."""

    history: list[int] = field(default_factory=list)  # arrivals per complete minute
    minute_count: int = 0
    arrivals: int = 0  # since the service started (for SLO attainment)
    within_slo: int = 0
    answered: int = 0
    window: Window | None = None
    timeline: deque = field(default_factory=lambda: deque(maxlen=TIMELINE))  # (t, desired, ready)


class ServiceController(BaseController):
    """The Service kind's controller: replica units, the router, and the autoscaler."""

    kind = "Service"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, policy: str = "faro-fairsum",
                 tick_s: float = 10.0, minute_s: float = 60.0, capacity_cpus: float = 0.0,
                 router: RouterSpec | None = None) -> None:
        """`minute_s`: wall seconds that count as one minute of arrivals history (60; less
        for a time-compressed replay). `capacity_cpus`: CPUs the services may use in all."""
        self.host, self.port = host, port
        self.policy_name, self.tick_s, self.minute_s = policy, tick_s, minute_s
        self.capacity_cpus = capacity_cpus
        self.router = Router(router or RouterSpec())
        self.server: RouterServer | None = None
        self._live: dict[int, _Live] = {}
        self._order: tuple[int, ...] = ()
        self._controller: Controller | None = None
        self._next_tick = 0.0
        self._t0: float | None = None
        self._minute = 0

    # --- the router -------------------------------------------------------------------------

    def address(self, status: Mapping | None = None) -> str:
        """The router's address: the configured port, or the one a service recorded before a
        restart, or a free one."""
        if self.server is None:
            port = self.port or int((status or {}).get("router_port") or 0) or free_port(self.host)
            self.server = RouterServer(self.router, self.host, port)
            self.server.start()
        return self.server.url

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()

    def start(self, w: Workload, ctx: Context) -> None:
        """A service is submitted, or found again after a restart: it gets its route."""
        url = self.address(w.status)
        self.server.call(self.router.add_service(w.name, w.secret))  # type: ignore[union-attr]
        self._live.setdefault(w.id, _Live())
        w.status.setdefault("desired", w.spec.min_replicas)
        w.status.update(router_port=self.server.port,  # type: ignore[union-attr]
                        url=f"{url}/v1/{w.name}/infer", slo_ms=w.spec.slo_ms)
        if w.spec.tuned:
            w.status.setdefault("tuned", "no replica has reported yet")

    def end(self, w: Workload, ctx: Context) -> None:
        if self.server is not None:
            self.server.call(self.router.remove_service(w.name))
        self._live.pop(w.id, None)

    def unit_ended(self, w: Workload, unit: str, ctx: Context) -> None:
        if self.server is not None:
            self.server.call(self.router.remove_unit(w.name, unit))

    def report_model(self, w: Workload, unit: str) -> type[BaseModel] | None:
        return ReplicaReport if unit.startswith("replica-") else None

    def report(self, w: Workload, unit: str, body: BaseModel, ctx: Context) -> bool:
        """A replica has loaded its model: with a tuned one, which records it runs."""
        tuned = getattr(body, "tuned", None)
        if tuned is None or w.status.get("tuned") == tuned:
            return False
        w.status["tuned"] = tuned
        return True

    def check(self, w: Workload, ctx: Context) -> None:
        """Refuse, in one line, a service whose replica set could never fit the cluster."""
        s: ServiceSpec = w.spec
        cluster_cpus, cluster_gpus = ctx.capacity().cpus, ctx.capacity().gpus
        need = s.max_replicas * s.resources.cpus
        if need > cluster_cpus:
            raise SpecError(f"max_replicas: {s.max_replicas} replicas of "
                            f"{s.resources.cpus:g} CPUs need {need:g} CPUs; the cluster has "
                            f"{cluster_cpus:g}")
        shares = s.max_replicas * (s.resources.gpu_fraction or 0)
        if shares > cluster_gpus:
            raise SpecError(f"max_replicas: {s.max_replicas} replicas of gpu_fraction "
                            f"{s.resources.gpu_fraction:g} need {shares:g} GPUs; the cluster "
                            f"has {cluster_gpus}")

    # --- units ------------------------------------------------------------------------------

    def units(self, w: Workload, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        n = int(w.status.get("desired", w.spec.min_replicas))
        return [Unit(f"replica-{i}", self.replica_spec(w, i)) for i in range(n)]

    def replica_spec(self, w: Workload, i: int) -> JobSpec:
        s: ServiceSpec = w.spec
        unit = f"replica-{i}"
        register = f"{self.address(w.status)}/_plinth/replicas/{w.name}"
        command = [sys.executable, "-m", "plinth.serve.replica", "--model", s.model,
                   "--input-shape", ",".join(map(str, s.input_shape)), "--slo-ms", f"{s.slo_ms:g}",
                   "--max-batch", str(s.batching.max_batch),
                   "--max-wait-ms", f"{s.batching.max_wait_ms:g}", "--port", "0",
                   "--register", register, "--unit", unit]
        if s.handler:
            command += ["--handler", s.handler]
        if s.workdir:
            command += ["--workdir", s.workdir]
        if s.tuned:
            command += ["--tuned-db", s.tuned.db, "--tuned-target", s.tuned.target]
        return JobSpec(name=f"{w.name}.{unit}", tenant=w.tenant, command=command,
                       env={**s.env, "PLINTH_REPLICA_SECRET": w.secret,
                            "OMP_NUM_THREADS": str(s.threads())},
                       workdir=s.workdir, resources=s.resources, priority=s.priority,
                       preemptible=s.preemptible)

    # --- the autoscaler ---------------------------------------------------------------------

    def tick(self, ws: list[Workload], ctx: Context) -> list[Workload]:
        """Every `tick_s`: read the router, decide for every service at once, and return the
        services whose desired replica count changed."""
        now = ctx.now()
        if not ws or self.server is None or now < self._next_tick:
            return []
        self._next_tick = now + self.tick_s
        windows = self.server.call(self.router.take_window(
            {w.name: w.spec.slo_ms / 1000 for w in ws}))
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
            live, win = self._live.setdefault(w.id, _Live()), windows.get(w.name)
            if win is None:
                continue
            live.window = win
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
        cap = int(self.capacity_cpus // per_replica) if self.capacity_cpus else 10**6
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

"""Prometheus metrics of the control plane, served at /metrics (admin token) by `plinth.control.ui`.

Counters and histograms are updated by small hooks where the event happens (a submission, a
scheduling pass, a store commit). Gauges are read at scrape time from the owner and the store,
so nothing is kept up to date between scrapes:

    plinth_jobs_submitted_total{tenant,kind}      jobs accepted (rate() gives submissions/s)
    plinth_scheduler_pass_seconds                 the policy's time in one pass (histogram)
    plinth_scheduler_decisions_total{kind}        a pass's lifecycle moves: started, move, ...
    plinth_store_transaction_seconds              begin to commit of a store write (histogram)
    plinth_held_jobs_examined_total               held jobs the control loop looked at (what a
                                                  step cost: it grows with what changed, not
                                                  with what is held)
    plinth_queue_depth{tenant,kind}               pending workloads
    plinth_jobs{state}                            jobs in the store by lifecycle state
    plinth_gpus_allocated{model}, plinth_gpus_free{model}   GPUs (fractions count) by model
    plinth_fl_round_seconds{task}, plinth_fl_round_participants{task,outcome}
    plinth_service_replicas{service,state}

The FLTask controller calls `fl_round` for each round its server commits, and the workloads'
loop calls `service_replicas` for each service at every autoscaler tick.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from plinth.control.store import Store, jobs

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane
    from plinth.sched.owner import Output

# `*_created` series double the exposition and no dashboard reads them.
disable_created_metrics()

# Pass latency from 50 us (an idle queue) to 10 s (an LP policy over thousands of jobs).
PASS_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0, 2.5, 10.0)
STORE_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
FL_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def jobs_by_state(store: Store) -> dict[str, int]:
    """How many jobs the store holds in each state (one GROUP BY over the state index)."""
    q = sa.select(jobs.c.state, sa.func.count()).group_by(jobs.c.state)
    with store.engine.connect() as c:
        return {state: int(n) for state, n in c.execute(q)}


class ControlMetrics:
    def __init__(self, cp: ControlPlane) -> None:
        self.registry = r = CollectorRegistry()
        self._submitted = Counter("plinth_jobs_submitted", "Jobs accepted by the control plane",
                                  ["tenant", "kind"], registry=r)
        self._pass = Histogram("plinth_scheduler_pass_seconds",
                               "Time the scheduling policy took in one pass", buckets=PASS_BUCKETS,
                               registry=r)
        self._decisions = Counter("plinth_scheduler_decisions",
                                  "Lifecycle moves decided by scheduling passes, by kind",
                                  ["kind"], registry=r)
        self._store = Histogram("plinth_store_transaction_seconds",
                                "Store write transactions, begin to commit",
                                buckets=STORE_BUCKETS, registry=r)
        self._examined = Counter("plinth_held_jobs_examined",
                                 "Held jobs (dependencies, array throttles) the control loop "
                                 "looked at", registry=r)
        self._fl_round = Histogram("plinth_fl_round_seconds", "Federated round wall time",
                                   ["task"], buckets=FL_BUCKETS, registry=r)
        self._fl_clients = Gauge("plinth_fl_round_participants",
                                 "Clients in the last round of a federated task",
                                 ["task", "outcome"], registry=r)
        self._replicas = Gauge("plinth_service_replicas", "Replicas of an inference service",
                               ["service", "state"], registry=r)
        r.register(_Snapshot(cp))
        self._watch(cp.store.engine)

    # --- hooks ----------------------------------------------------------------------------------

    def submitted(self, tenant: str, kind: str) -> None:
        self._submitted.labels(tenant, kind).inc()

    def scheduled(self, out: Output) -> None:
        """After a scheduling pass: its latency and its decisions."""
        self._pass.observe(out.policy_s)
        for kind, n in Tally(t.kind for t in out.transitions).items():
            self._decisions.labels(kind).inc(n)

    def held_examined(self, n: int) -> None:
        """After the holds were looked at: how many held jobs that cost."""
        self._examined.inc(n)

    def fl_round(self, task: str, *, seconds: float, updates: int, failures: int) -> None:
        """Hook for a federated task's aggregator: one finished round."""
        self._fl_round.labels(task).observe(seconds)
        self._fl_clients.labels(task, "updated").set(updates)
        self._fl_clients.labels(task, "failed").set(failures)

    def service_replicas(self, service: str, *, desired: int, ready: int) -> None:
        """Hook for a service's autoscaler: the replica count it wants and the count serving."""
        self._replicas.labels(service, "desired").set(desired)
        self._replicas.labels(service, "ready").set(ready)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def _watch(self, engine: sa.Engine) -> None:
        # A read-only connection ends in a rollback; only commits (writes) are timed.
        def begin(conn: Any) -> None:
            conn.info["plinth_t0"] = time.perf_counter()

        def commit(conn: Any) -> None:
            t0 = conn.info.pop("plinth_t0", None)
            if t0 is not None:
                self._store.observe(time.perf_counter() - t0)

        sa.event.listen(engine, "begin", begin)
        sa.event.listen(engine, "commit", commit)


class _Snapshot(Collector):
    """The gauges, read from the owner (under its lock) and the store when scraped."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def describe(self) -> list:
        return []  # registering must not scrape (the owner is not running yet)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        cp = self.cp

        def read(owner: Any) -> tuple[Tally, Any]:
            specs = cp.specs
            depth = Tally((js.job.tenant, specs[js.id].kind if js.id in specs else "Job")
                          for js in owner.pending)
            return depth, owner.held.gpu_free_milli.copy()

        depth, free_milli = cp.read(read)
        queue = GaugeMetricFamily("plinth_queue_depth", "Pending workloads",
                                  labels=["tenant", "kind"])
        for (tenant, kind), n in sorted(depth.items()):
            queue.add_metric([tenant, kind], n)
        yield queue

        alloc = GaugeMetricFamily("plinth_gpus_allocated", "GPUs allocated (fractions count)",
                                  labels=["model"])
        free = GaugeMetricFamily("plinth_gpus_free", "GPUs free (fractions count)",
                                 labels=["model"])
        by_model: dict[str, list[float]] = {}
        for i, node in enumerate(cp.cluster.nodes):
            first, count = cp.cluster.node_gpu_range[i]
            if count and node.gpu_model:
                f = float(free_milli[first:first + count].sum()) / 1000
                used_free = by_model.setdefault(node.gpu_model, [0.0, 0.0])
                used_free[0] += count - f
                used_free[1] += f
        for model, (u, f) in sorted(by_model.items()):
            alloc.add_metric([model], u)
            free.add_metric([model], f)
        yield alloc
        yield free

        states = GaugeMetricFamily("plinth_jobs", "Jobs in the store by state", labels=["state"])
        for state, n in sorted(jobs_by_state(cp.store).items()):
            states.add_metric([state], n)
        yield states

"""What each dashboard page shows, as plain data for its template.

The queue and the GPUs are read from the owner (in memory, in the policy's order) under the
control plane's lock; only one page of jobs is ever built, so a page costs the same with ten
jobs in the store as with ten thousand. A tenant's principal sees its own jobs and tenant only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from plinth.control.auth import Principal
from plinth.control.routes.jobs import wall_times
from plinth.control.service import ControlPlane
from plinth.sched.owner import Owner
from plinth.sched.types import JobState

PAGE = 50
RUNNING_SHOWN = 200


@dataclass(frozen=True, slots=True)
class QueueRow:
    position: int  # 1-based, in the whole queue as the policy orders it
    id: int
    name: str
    tenant: str
    priority: int
    gpus: float
    workers: int
    state: str
    waited_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class RunningRow:
    id: int
    name: str
    tenant: str
    gpus: float
    state: str
    running_s: float
    model: str | None


@dataclass(frozen=True, slots=True)
class QueueView:
    pending: list[QueueRow]
    pending_total: int
    page: int
    pages: int
    running: list[RunningRow]
    running_total: int


def _gpus(js: JobState) -> float:
    r = js.job.request
    return (r.gpus or r.gpu_milli / 1000) * r.workers


def queue(cp: ControlPlane, who: Principal, page: int, now: float) -> QueueView:
    def read(owner: Owner) -> QueueView:
        mine = (lambda js: True) if who.admin else (lambda js: js.job.tenant == who.tenant)
        start = (page - 1) * PAGE
        if who.admin:  # a slice of the sorted queue: O(log n + PAGE)
            total = len(owner.pending)
            chosen = list(zip(range(start, start + PAGE), owner.pending.islice(start, start + PAGE)))
        else:  # one pass over the queue, keeping this tenant's page with its global position
            own = ((i, js) for i, js in enumerate(owner.pending) if mine(js))
            chosen, total = [], 0
            for n, item in enumerate(own):
                if start <= n < start + PAGE:
                    chosen.append(item)
                total = n + 1
        pending = [QueueRow(i + 1, js.id, js.job.name, js.job.tenant, js.job.priority, _gpus(js),
                            js.job.request.workers, js.status.value, now - js.pending_since,
                            wall_times(cp.reason(js.id) or ""))
                   for i, js in chosen]
        run = [js for js in owner.running.values() if mine(js)]
        run.sort(key=lambda js: js.id)
        running = [RunningRow(js.id, js.job.name, js.job.tenant, _gpus(js), js.status.value,
                              now - (js.start_time or now), js.model)
                   for js in itertools.islice(run, RUNNING_SHOWN)]
        return QueueView(pending, total, page, max(1, -(-total // PAGE)), running, len(run))

    return cp.read(read)


def cluster(cp: ControlPlane, who: Principal) -> dict[str, Any]:
    """Every node and GPU with its allocated SM share and memory, and the tenants' quota use."""

    def read(owner: Owner) -> dict[str, Any]:
        held, nodes = owner.held, []
        for i, node in enumerate(cp.cluster.nodes):
            first, count = cp.cluster.node_gpu_range[i]
            cap = node.model.memory_mib if node.model else 0
            gpus = []
            for g in range(first, first + count):
                sm = (1000 - int(held.gpu_free_milli[g])) / 1000
                mem = (cap - int(held.gpu_free_mem[g])) / cap if cap else 0.0
                if sm >= 1.0 and mem == 0.0:  # held whole: its memory is the job's too
                    mem = 1.0
                gpus.append({"index": g - first, "sm": sm, "mem": mem,
                             "mem_used_mib": cap - int(held.gpu_free_mem[g]), "mem_mib": cap})
            nodes.append({"name": node.name, "model": node.gpu_model, "gpus": gpus,
                          "gpus_used": sum(x["sm"] for x in gpus)})
        used: dict[str, float] = {}
        for js in owner.running.values():
            if js.allocation is not None:
                used[js.job.tenant] = (used.get(js.job.tenant, 0.0)
                                       + js.allocation.gpu_milli_total / 1000)
        pending: dict[str, int] = {}
        for js in owner.pending:
            pending[js.job.tenant] = pending.get(js.job.tenant, 0) + 1
        # The quotas the policy enforces: the configured ones, or the equal shares a quota
        # policy derives from the tenants it has seen (an empty set adds none).
        quotas_for = getattr(owner.policy, "quotas_for", None)
        quotas = (quotas_for(owner.cluster, set()) if quotas_for is not None
                  else owner.cluster.tenants)
        return {"nodes": nodes, "used": used, "pending": pending,
                "quotas": {q.name: q for q in quotas}, "quota_policy": quotas_for is not None}

    got = cp.read(read)
    quotas = got["quotas"]
    tenants = []
    for name in sorted(cp.tenant_names):
        if not who.may_see(name):
            continue
        q = quotas.get(name)
        use = got["used"].get(name, 0.0)
        # a tenant a quota policy does not name has 0 nominal GPUs: it borrows idle quota only
        nominal = (q.nominal_gpus if q is not None else 0.0) if got["quota_policy"] else None
        tenants.append({"name": name, "used": use, "quota": nominal,
                        "borrowing_limit": q.borrowing_limit if q is not None else None,
                        "borrowed": max(0.0, use - nominal) if nominal is not None else None,
                        "pending": got["pending"].get(name, 0)})
    total = cp.cluster.total_gpus
    used_all = sum(n["gpus_used"] for n in got["nodes"])
    return {"nodes": got["nodes"], "tenants": tenants, "total_gpus": total,
            "used_gpus": used_all, "describe": cp.cluster.describe(),
            "quota_policy": got["quota_policy"], "policy": cp.policy_name}


def allocation(cp: ControlPlane, alloc: dict | None) -> list[dict]:
    """A stored allocation's slots with node names and per-node GPU indices."""
    if not alloc:
        return []
    out = []
    for s in alloc["slots"]:
        node = cp.cluster.nodes[s["node"]] if s["node"] < len(cp.cluster.nodes) else None
        first = cp.cluster.node_gpu_range[s["node"]][0] if node else 0
        out.append({"node": node.name if node else f"#{s['node']}",
                    "gpus": [g - first for g in s["gpus"]], "share": s["milli"] / 1000,
                    "gpu_memory_mib": s["gpu_memory_mib"]})
    return out


def log_tail(cp: ControlPlane, job_id: int, size: int = 16 * 1024) -> str:
    path = cp.log_path(job_id)
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ServiceRow:
    name: str
    tenant: str
    url: str
    desired: int
    ready: int
    min_replicas: int
    max_replicas: int
    rate_rps: float
    predicted_rps: float
    p99_ms: float
    slo_ms: float
    attainment: float | None  # share of its requests answered within the SLO
    reason: str  # why the autoscaler chose `desired`
    units: list[tuple[str, int, str]]  # (unit, its newest job, state)
    lines: dict[str, str]  # SVG points of desired and ready replicas over time
    decisions: list[dict[str, Any]]  # the autoscaler's last decisions, newest first


def services(cp: ControlPlane, who: Principal) -> list[ServiceRow]:
    """The active services the principal may see, with what the autoscaler last decided."""
    out = []
    for w in sorted(cp.read(lambda _: list(cp.workloads.active.values())), key=lambda w: w.id):
        if w.kind != "Service" or not who.may_see(w.tenant):
            continue
        st = w.status
        units = {j["unit"]: (j["unit"], j["id"], j["state"]) for j in cp.store.units(w.id)}
        out.append(ServiceRow(
            w.name, w.tenant, st.get("url", ""), int(st.get("desired", 0)),
            int(st.get("ready", 0)), w.spec.min_replicas, w.spec.max_replicas,
            float(st.get("rate_rps", 0.0)), float(st.get("predicted_rps", 0.0)),
            float(st.get("p99_ms", 0.0)), w.spec.slo_ms, st.get("slo_attainment"),
            st.get("reason") or f"min_replicas {w.spec.min_replicas}; no autoscaler decision "
                                "has changed it yet", sorted(units.values()),
            sparkline(cp.workloads.controller("Service").timeline(w.id)),
            list(reversed(st.get("decisions", [])))))
    return out


def sparkline(points: list[tuple[float, int, int]], width: int = 160, height: int = 28
              ) -> dict[str, str]:
    """SVG polyline points for desired and ready replicas over the ticks kept."""
    if not points:
        return {"desired": "", "ready": ""}
    top = max(max(d, r) for _, d, r in points) or 1
    step = width / max(len(points) - 1, 1)

    def line(k: int) -> str:
        return " ".join(f"{i * step:.1f},{height - 2 - (p[k] / top) * (height - 4):.1f}"
                        for i, p in enumerate(points))
    return {"desired": line(1), "ready": line(2)}


@dataclass(frozen=True, slots=True)
class FLTaskRow:
    name: str
    tenant: str
    state: str
    address: str
    round: int
    rounds: int | None
    epsilon: float | None
    epsilon_budget: float | None
    per_round: list[dict[str, Any]]  # newest first: accuracy, loss, participants, failures, leaves


def fl_tasks(cp: ControlPlane, who: Principal) -> list[FLTaskRow]:
    """The FL tasks the principal may see (active, then the last finished ones)."""
    rows = cp.store.workloads(tenant=None if who.admin else who.tenant)
    out = []
    for r in rows:
        if r["kind"] != "FLTask" or len(out) >= 20:
            continue
        live = cp.workloads.active.get(r["id"])
        st = dict(live.status) if live is not None else r["status"]
        out.append(FLTaskRow(r["name"], r["tenant"], r["state"], st.get("address", ""),
                             int(st.get("round", 0)), st.get("rounds"), st.get("epsilon"),
                             st.get("epsilon_budget"),
                             list(reversed(st.get("per_round", [])))))
    return out

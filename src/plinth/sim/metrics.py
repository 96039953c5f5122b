"""Summary metrics of a simulation, with the keys scripts rely on."""

from __future__ import annotations

import numpy as np

from plinth.core.lifecycle import State
from plinth.sched.policies.base import Policy
from plinth.sched.types import SchedConfig
from plinth.sim.engine import SimResult


def summarize(r: SimResult) -> dict:
    done = [js for js in r.jobs if js.status is State.SUCCEEDED]
    jct = np.array([js.end_time - js.job.submit_time for js in done])
    queue = np.array([js.first_start - js.job.submit_time for js in done])
    capacity = r.cluster.total_gpus * r.makespan
    rho = r.ftf_rho
    out = {
        "policy": r.policy,
        "jobs": len(r.jobs),
        "completed": len(done),
        "rejected": sum(js.status is State.REJECTED for js in r.jobs),
        "avg_jct_s": _f(jct.mean()) if jct.size else None,
        "p50_jct_s": _f(np.percentile(jct, 50)) if jct.size else None,
        "p99_jct_s": _f(np.percentile(jct, 99)) if jct.size else None,
        "avg_queue_s": _f(queue.mean()) if queue.size else None,
        "makespan_s": _f(r.makespan),
        "gpu_utilization": _f(r.gpu_seconds_used / capacity) if capacity else 0.0,
        "ftf_rho_median": _f(np.median(rho)) if rho.size else None,
        "ftf_rho_max": _f(rho.max()) if rho.size else None,
        "preemptions": r.preemptions,
        "lost_work_s": _f(r.lost_work_s),
        "passes": r.passes,
        "sim_wall_s": _f(r.wall_s),
    }
    return out


def run_settings(policy: Policy, config: SchedConfig) -> dict:
    """What a result depends on beyond the trace and the cluster, for its row: whether the
    policy allocates in rounds (Gavel's `time_per_iteration`, Themis' lease) and how long they
    are, and which throughput matrix set the job speeds."""
    rounds = getattr(policy, "round_based", False)
    return {
        "round_s": (config.round_s if rounds else None),
        "rounds": (None if not rounds else
                   f"{config.round_s:g} s" if config.round_s > 0 else "off (every event)"),
        "throughputs": config.throughputs.source,
    }


def jct_values(r: SimResult) -> np.ndarray:
    return np.array([js.end_time - js.job.submit_time for js in r.jobs
                     if js.status is State.SUCCEEDED])


def _f(x: float) -> float:
    return float(x)

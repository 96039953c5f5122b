"""Run one or several policies over the same trace: the shared path of the CLI, the demo
and the benchmarks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from plinth.core.errors import SpecError
from plinth.core.resources import Cluster
from plinth.core.workload import Job
from plinth.sched.placement import PlacementConfig
from plinth.sched.policies import make_policy
from plinth.sched.types import SchedConfig
from plinth.sim.engine import SimResult, simulate
from plinth.sim.metrics import summarize

PLACEMENTS = ("bestfit", "fgd")


def sched_config(placement: str = "bestfit", jobs: list[Job] | None = None,
                 **overrides: object) -> SchedConfig:
    """A scheduler config; `fgd` builds its target workload from the jobs' request mix."""
    if placement not in PLACEMENTS:
        raise SpecError(f"--placement: unknown {placement!r}; choose one of: {', '.join(PLACEMENTS)}")
    pcfg = PlacementConfig(fractional=placement)
    if placement == "fgd":
        from plinth.sched.fgd import WorkloadProfile

        pcfg = dataclasses.replace(pcfg, profile=WorkloadProfile.from_requests(
            [j.request for j in jobs or []]))
    return dataclasses.replace(SchedConfig(placement=pcfg), **overrides)  # type: ignore[arg-type]


def compare(
    jobs: list[Job],
    cluster: Cluster,
    policies: list[str],
    config: SchedConfig | None = None,
    *,
    alibaba: bool = False,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[SimResult], list[dict]]:
    """Simulate each policy on the same jobs. Policy names are all checked before any runs."""
    built = [make_policy(p) for p in policies]
    results, rows = [], []
    inflation = None
    if alibaba:
        # The FGD paper's measure: pods in trace order, no departures, until one fails. It
        # depends on placement only, so every policy in the comparison shares it.
        from plinth.sim.inflate import first_failure

        pcfg = (config or SchedConfig()).placement
        inflation = first_failure(cluster, [j.request for j in jobs], pcfg).alloc_ratio
    for policy in built:
        cb = None
        if on_progress is not None:
            name = policy.name
            cb = lambda done, total, name=name: on_progress(name, done, total)
        r = simulate(jobs, cluster, policy, config, on_progress=cb)
        row = summarize(r)
        if alibaba:
            row["gpu_alloc_ratio_at_first_failure"] = inflation
            # The same reading inside the replay itself (with departures); None if no pod
            # ever waited for resources.
            row["replay_alloc_ratio_at_first_failure"] = r.alloc_ratio_at_first_failure
        results.append(r)
        rows.append(row)
    return results, rows

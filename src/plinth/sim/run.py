"""Run one or several policies over the same trace: the shared path of the CLI, the demo
and the benchmarks."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from plinth.core.errors import SpecError
from plinth.core.registry import Registry
from plinth.core.throughput import Throughputs
from plinth.core.resources import Cluster
from plinth.core.workload import Job
from plinth.sched.placement import PlacementConfig
from plinth.sched.policies import make_policy
from plinth.sched.types import SchedConfig
from plinth.sim.engine import SimResult, simulate
from plinth.sim.metrics import run_settings, summarize

def _bestfit(jobs: list[Job]) -> PlacementConfig:
    return PlacementConfig(fractional="bestfit")


def _fgd(jobs: list[Job]) -> PlacementConfig:
    """FGD scores fragmentation against a target workload: the jobs' own request mix."""
    from plinth.sched.fgd import WorkloadProfile

    return PlacementConfig(fractional="fgd",
                           profile=WorkloadProfile.from_requests([j.request for j in jobs]))


PLACEMENTS: Registry[Callable[[list[Job]], PlacementConfig]] = Registry("placement",
                                                                         field="--placement")
PLACEMENTS.add("bestfit", _bestfit)
PLACEMENTS.add("fgd", _fgd)


def sched_config(placement: str = "bestfit", jobs: list[Job] | None = None,
                 **overrides: object) -> SchedConfig:
    """A scheduler config with the placement called `placement` (bestfit, fgd)."""
    pcfg = PLACEMENTS.make(placement, jobs=jobs or [])
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
        row.update(run_settings(policy, config or SchedConfig()))
        if alibaba:
            row["gpu_alloc_ratio_at_first_failure"] = inflation
            # The same reading inside the replay itself (with departures); None if no pod
            # ever waited for resources.
            row["replay_alloc_ratio_at_first_failure"] = r.alloc_ratio_at_first_failure
        results.append(r)
        rows.append(row)
    return results, rows


def parse_rounds(text: str) -> float:
    """`--rounds`: a round (lease) length in seconds for the round-based policies, or "off"
    (0): their allocation is then recomputed at every event instead of at round ends."""
    t = text.strip().lower()
    if t in ("off", "0", "none"):
        return 0.0
    try:
        value = float(t[:-1]) if t.endswith("s") else float(t)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"--rounds: expected a round length in seconds (e.g. 360) or 'off', "
                        f"got {text!r}")
    return value


def check_job_types(jobs: list[Job], throughputs: Throughputs, source: str) -> None:
    """A job type the matrix lacks would silently run at the catalog's speed: refuse it."""
    unknown = throughputs.unknown_types(jobs)
    if not unknown:
        return
    name, job = next(iter(unknown.items()))
    where = f" (line {job.source_line})" if job.source_line else ""
    known = ", ".join(repr(t) for t in throughputs.types[:6])
    more = f", ... ({len(throughputs.types)} in all)" if len(throughputs.types) > 6 else ""
    raise SpecError(f"{source}: job type {name!r}{where} is not in the throughputs "
                    f"({throughputs.source}); its job types: {known}{more}")

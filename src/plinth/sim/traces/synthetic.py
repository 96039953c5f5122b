"""Synthetic Philly-like workloads, deterministic for a seed.

- GPU counts: mostly 1, some 2/4/8, rare 16..64 (never above the cluster), in the spirit of the
  Philly trace where 93% of jobs use one GPU.
- Durations: lognormal around Philly's median (about 19 min) with sigma 2, so most jobs are short
  and a few run for days (the tail is cut at 14 days). `heavy_tail=False` uses sigma 0.5 around
  30 min, for tests that want steadier numbers.
- Arrivals: a Poisson process whose rate makes the offered load (GPU-seconds asked per second,
  over the cluster's GPUs) about `load`; the rate is set from the drawn jobs, so a short trace
  hits its target too.
- Tenants ``team-0``..: skewed (weights 1, 1/2, 1/3, ...) so fairness has something to fix.
- A `fractional` share of jobs are one fractional worker (gpu_milli 100..900, 1..15 GiB of GPU
  memory, so they fit a T4 or a 16 GiB V100).
"""

from __future__ import annotations

import numpy as np

from plinth.core.errors import SpecError
from plinth.core.resources import MILLI, Request
from plinth.core.workload import Job
from plinth.sim.traces.base import Trace

GPU_SIZES = np.array([1, 2, 4, 8, 16, 32, 64])
GPU_PROBS = np.array([0.78, 0.08, 0.07, 0.05, 0.015, 0.004, 0.001])
PHILLY_MEDIAN_S = 1144.0  # median job duration in the Philly trace
MIN_DURATION_S, MAX_DURATION_S = 10.0, 14 * 86400.0


def synthetic_jobs(n: int, *, seed: int, load: float = 0.8, cluster_gpus: int = 64,
                   tenants: int = 3, fractional: float = 0.0,
                   heavy_tail: bool = True) -> list[Job]:
    """`n` jobs sorted by submit time, ids 0..n-1, the first at time 0."""
    if n < 1:
        raise SpecError(f"synthetic: n must be >= 1, got {n}")
    if not load > 0:
        raise SpecError(f"synthetic: load must be > 0, got {load}")
    if cluster_gpus < 1:
        raise SpecError(f"synthetic: cluster_gpus must be >= 1, got {cluster_gpus}")
    if tenants < 1:
        raise SpecError(f"synthetic: tenants must be >= 1, got {tenants}")
    if not 0.0 <= fractional <= 1.0:
        raise SpecError(f"synthetic: fractional must be in [0, 1], got {fractional}")

    rng = np.random.default_rng(seed)
    fits = GPU_SIZES <= cluster_gpus
    probs = GPU_PROBS[fits] / GPU_PROBS[fits].sum()
    # Every array is drawn whatever the options, so changing one option (say `fractional`)
    # does not reshuffle the others for the same seed.
    gpus = rng.choice(GPU_SIZES[fits], size=n, p=probs)
    if heavy_tail:
        dur = rng.lognormal(np.log(PHILLY_MEDIAN_S), 2.0, size=n)
    else:
        dur = rng.lognormal(np.log(1800.0), 0.5, size=n)
    dur = np.clip(dur, MIN_DURATION_S, MAX_DURATION_S)
    weights = 1.0 / np.arange(1, tenants + 1)
    tenant = rng.choice(tenants, size=n, p=weights / weights.sum())
    is_frac = rng.random(n) < fractional
    milli = rng.integers(10, 91, size=n) * 10  # 100..900 in steps of 10
    gpu_mem = rng.integers(1, 16, size=n) * 1024
    gaps = rng.exponential(1.0, size=n)

    demand = np.where(is_frac, milli / MILLI, gpus)  # GPUs held while running
    rate = load * cluster_gpus / float(np.mean(demand * dur))  # arrivals per second
    submit = np.cumsum(gaps / rate)
    submit -= submit[0]

    requests: dict[tuple, Request] = {}
    jobs: list[Job] = []
    for i, (s, d, g, t, f, m, gm) in enumerate(zip(submit.tolist(), dur.tolist(), gpus.tolist(),
                                                   tenant.tolist(), is_frac.tolist(),
                                                   milli.tolist(), gpu_mem.tolist(), strict=True)):
        key = (0, m, gm) if f else (g, 0, 0)
        req = requests.get(key)
        if req is None:
            req = requests[key] = (Request(gpu_milli=m, gpu_memory_mib=gm) if f
                                   else Request(gpus=1, workers=g))
        jobs.append(Job(id=i, submit_time=s, duration=d, request=req, name=f"syn-{i:06d}",
                        tenant=f"team-{t}"))
    return jobs


def synthetic_trace(n: int, *, seed: int, **options: float | bool) -> Trace:
    """`synthetic_jobs` wrapped as a `Trace`, for code that takes traces."""
    jobs = synthetic_jobs(n, seed=seed, **options)  # type: ignore[arg-type]
    return Trace(jobs=jobs, source=f"synthetic(n={n}, seed={seed})", format="synthetic")

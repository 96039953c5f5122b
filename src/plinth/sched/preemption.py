"""Choosing preemption victims.

A policy lists the running jobs it is willing to preempt, least important first. This module
filters out those that are protected (not preemptible, inside their guaranteed runtime, or
preempted too often already), orders equally important ones so that the job with the least
unsaved work (the most recent checkpoint) goes first, and releases victims on a scratch copy
until the waiting job fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from plinth.core.resources import Allocation, Request
from plinth.sched.placement import PlacementConfig, place
from plinth.sched.state import ClusterState
from plinth.sched.types import JobState, SchedConfig


def guaranteed_runtime(js: JobState, cfg: SchedConfig) -> float:
    """How long this run is protected. It grows with each preemption (backoff)."""
    return cfg.min_runtime * cfg.preempt_backoff ** js.preemptions


def can_preempt(js: JobState, now: float, cfg: SchedConfig) -> bool:
    if not js.job.preemptible or js.preemptions >= cfg.max_preemptions:
        return False
    started = js.start_time if js.start_time is not None else now
    return now - started >= guaranteed_runtime(js, cfg)


def victim_order(importance: Callable[[JobState], object]) -> Callable[[JobState], tuple]:
    """Sort key: least important first, then least unsaved work, then newest checkpoint."""
    def key(js: JobState) -> tuple:
        ckpt = js.checkpoint_time if js.checkpoint_time is not None else float("-inf")
        return (importance(js), js.unsaved, -ckpt, js.id)
    return key


def find_victims(
    work: ClusterState,
    req: Request,
    candidates: Iterable[JobState],
    now: float,
    cfg: SchedConfig,
    placement: PlacementConfig | None = None,
) -> tuple[list[JobState], ClusterState, Allocation] | None:
    """Victims (in the order given) whose release lets `req` fit, the scratch state with them
    released, and the allocation found. None if even all eligible candidates do not suffice.
    `work` itself is left unchanged."""
    pcfg = placement or cfg.placement
    scratch = work.copy()
    victims: list[JobState] = []
    short = req.gpu_milli_total - work.free_milli  # GPU share still missing, free share counted
    for js in candidates:
        if js.allocation is None or not can_preempt(js, now, cfg):
            continue
        scratch.release(js.allocation, js.job.request)
        victims.append(js)
        short -= js.allocation.gpu_milli_total
        if short > 0:
            continue  # cannot fit yet: skip the placement attempt
        alloc = place(scratch, req, pcfg)
        if alloc is not None:
            return prune_victims(work, req, victims, alloc, pcfg)
    return None


def prune_victims(work: ClusterState, req: Request, victims: list[JobState], alloc: Allocation,
           pcfg: PlacementConfig) -> tuple[list[JobState], ClusterState, Allocation]:
    """Drop victims that turned out unnecessary (most important first)."""
    keep = list(victims)
    for js in reversed(victims[:-1]):
        trial = [v for v in keep if v is not js]
        scratch = work.copy()
        for v in trial:
            scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
        a = place(scratch, req, pcfg)
        if a is not None:
            keep, alloc = trial, a
    scratch = work.copy()
    for v in keep:
        scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
    return keep, scratch, alloc

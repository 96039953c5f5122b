"""Sizing the LIFL tree: a pure function of the round's load and the leaves' measured speed.

LIFL (Qi et al., MLSys'24) scales aggregators to the load instead of keeping them always on.
A round brings `expected_updates` updates of `update_bytes` each; a leaf folds
`throughput_bps_per_leaf` bytes a second (measured online: an EWMA of the leaves' own busy time
per byte, `ewma`); the round's folding should take no more than `round_deadline_s`. So

    leaves = ceil(expected_updates * update_bytes / (throughput_bps_per_leaf * round_deadline_s))

clamped to [1, min(max_leaves, expected_updates)]. Before anything was measured the prior is
`prior_updates_per_leaf` updates a leaf. `max_updates_per_leaf`, when set, is a floor on top of
the throughput: at least ceil(expected_updates / max_updates_per_leaf) leaves, so that a leaf
that dies mid-round takes about that many of the round's updates with it, however fast the
leaves fold (small models fold so fast that throughput alone asks for one leaf). No CPU count
is read here: the runtime gives each aggregator unit its CPUs (`cpus` is the hint the
scheduler packs by), and `max_leaves` is the task's budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plinth.core.errors import PlinthError


@dataclass(frozen=True, slots=True)
class TreeShape:
    """The tree a round wants: leaves, middle aggregators, updates a leaf, CPUs a unit."""

    leaves: int
    middles: int
    updates_per_leaf: int
    cpus: float = 1.0  # per aggregator unit, for the scheduler's bin-packing
    reason: str = ""


def size_tree(*, expected_updates: int, update_bytes: int,
              throughput_bps_per_leaf: float | None, round_deadline_s: float,
              max_leaves: int, leaves_per_middle: int | None = None,
              prior_updates_per_leaf: int = 8, fixed_leaves: int | None = None,
              max_updates_per_leaf: int | None = None, cpus_per_leaf: float = 1.0
              ) -> TreeShape:
    """The tree for a round of `expected_updates` updates of `update_bytes` (see the module).

    `fixed_leaves` overrides the computation (still capped by `max_leaves`); a middle
    aggregator takes at most `leaves_per_middle` leaves (default: all of them, one node).
    """
    if max_leaves < 1:
        raise PlinthError(f"size_tree: max_leaves must be >= 1 (got {max_leaves})")
    if not round_deadline_s > 0:
        raise PlinthError(f"size_tree: round_deadline_s must be > 0 (got {round_deadline_s})")
    n_up = max(0, int(expected_updates))
    cap = max(1, min(max_leaves, n_up))
    if fixed_leaves is not None:
        leaves = max(1, min(int(fixed_leaves), max_leaves))
        why = f"fixed at {leaves} leaves"
    elif throughput_bps_per_leaf is None or not throughput_bps_per_leaf > 0:
        leaves = max(1, min(cap, math.ceil(n_up / max(1, prior_updates_per_leaf))))
        why = (f"no throughput measured yet: {n_up} updates / {prior_updates_per_leaf} a leaf "
               f"-> {leaves} leaves")
    else:
        work = n_up * max(0, int(update_bytes))
        want = math.ceil(work / (throughput_bps_per_leaf * round_deadline_s))
        leaves = max(1, min(cap, want))
        why = (f"{n_up} updates x {update_bytes / 1e6:.3g} MB at "
               f"{throughput_bps_per_leaf / 1e6:.4g} MB/s a leaf within {round_deadline_s:g}s "
               f"-> {want} leaves, {leaves} within [1, {cap}]")
    if fixed_leaves is None and max_updates_per_leaf is not None:
        floor = math.ceil(n_up / max(1, max_updates_per_leaf))
        if floor > leaves:
            leaves = max(1, min(cap, floor))
            why += f"; at most {max_updates_per_leaf} updates a leaf -> {leaves} leaves"
    per_middle = leaves_per_middle or leaves
    middles = math.ceil(leaves / max(1, per_middle))
    return TreeShape(leaves, middles, math.ceil(n_up / leaves) if n_up else 0,
                     float(cpus_per_leaf), why)


def ewma(previous: float | None, sample: float | None, *, alpha: float = 0.5) -> float | None:
    """An exponentially weighted mean: `sample` folded into `previous` with weight `alpha`.
    A missing or non-positive sample (a round that folded nothing) leaves it unchanged."""
    if not 0 < alpha <= 1:
        raise PlinthError(f"ewma: alpha must be in (0, 1] (got {alpha})")
    if sample is None or not math.isfinite(sample) or sample <= 0:
        return previous
    return sample if previous is None else alpha * sample + (1 - alpha) * previous


def leaf_throughput(folded_bytes: list[int], busy_s: list[float]) -> float | None:
    """One round's throughput of a leaf, bytes a second: the leaves' folded bytes over their
    busy seconds (leaves that folded nothing are left out); None if none folded."""
    pairs = [(b, s) for b, s in zip(folded_bytes, busy_s) if b > 0 and s > 0]
    if not pairs:
        return None
    return sum(b for b, _ in pairs) / sum(s for _, s in pairs)

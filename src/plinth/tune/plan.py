"""Pure planning of a tuning task: share keys, which client tunes which tasks, with what budget.

Every client extracts the same tasks in the same order, so each computes its own shard from
the task list alone, with no coordinator: `shard(tasks, k)[i]` is client i's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from plinth.tune.model import Task


def share_key(share: float) -> str:
    """The RPC tracker key (and database folder) of a share: "share-2", "share-12.5"."""
    return f"share-{share:g}"


def shard(tasks: Sequence[Task], k: int) -> list[list[int]]:
    """Task indices for each of `k` clients. A client's budget, and so its time, is in
    proportion to its task count (`budget`), so the counts are balanced; dealing the tasks out
    heaviest first (weighted FLOPs) spreads the big ones. Ties break by index, so every client
    agrees."""
    if k < 1:
        raise ValueError(f"clients: must be >= 1 (got {k})")
    order = sorted(range(len(tasks)), key=lambda i: (-tasks[i].flops * tasks[i].weight, i))
    return [sorted(order[c::k]) for c in range(k)]


def budget(trials: int, mine: int, total: int) -> int:
    """A shard's share of the trial budget, in proportion to its task count; at least one
    trial per task, so every task gets a record."""
    if mine == 0:
        return 0
    return max(mine, math.ceil(trials * mine / total))


def parse_shard(text: str) -> tuple[int, int]:
    """`"1/4"` -> (1, 4): client 1 of 4."""
    i, _, k = text.partition("/")
    try:
        index, count = int(i), int(k)
    except ValueError:
        raise ValueError(f"--shard: expected I/K such as 0/2, got {text!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"--shard: need 0 <= I < K, got {text!r}")
    return index, count

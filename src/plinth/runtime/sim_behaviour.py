"""What a simulated job acts out besides its work (`SimBehaviour`), and how a gang's attempt
ends given what each worker does and the stops it gets (`gang_end`, as the local runtime ends
one). Used by the simulated runtime (`plinth.runtime.sim`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from plinth.core.workload import Job

STOPPED_EXIT_CODE = 143  # what a job that honours SIGTERM exits with (128 + 15)
KILLED_EXIT_CODE = 137  # what the SIGKILL at the end of the grace leaves (128 + 9)


@dataclass(frozen=True, slots=True)
class SimBehaviour:
    """What a simulated attempt acts out besides its work. Times are seconds after its launch.

    `exit_code` is the code it exits with when it ends on its own, at `exit_at` (None: when its
    work is done). At `vanish_at` it vanishes instead, unless it ended before: the attempt is
    lost. With `ignore_term` a stop's SIGTERM does nothing: it runs on (and saves) until the
    SIGKILL at the end of the grace, or until its own end if that comes first. `checkpoints`
    are its saves, (seconds, step) in time order, each reported as `CheckpointSaved` (and the
    cadence declared in `Started` is then 0); None keeps the default model, the configured
    cadence. `ranks` says what some workers of a gang do instead (without `ranks` of their own).
    """

    exit_code: int = 0
    exit_at: float | None = None
    vanish_at: float | None = None
    ignore_term: bool = False
    checkpoints: tuple[tuple[float, int], ...] | None = None
    ranks: Mapping[int, SimBehaviour] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("exit_at", "vanish_at"):
            v = getattr(self, name)
            if v is not None and not v >= 0:  # NaN is refused too
                raise ValueError(f"SimBehaviour.{name}: must be >= 0 seconds, got {v!r}")
        if self.checkpoints is not None:
            times = [t for t, _ in self.checkpoints]
            if not all(t >= 0 for t in times) or times != sorted(times) or \
                    any(step < 0 for _, step in self.checkpoints):
                raise ValueError("SimBehaviour.checkpoints: (seconds >= 0, step >= 0) in time "
                                 f"order, got {self.checkpoints!r}")
        for rank, b in self.ranks.items():
            if rank < 0 or b.ranks:
                raise ValueError(f"SimBehaviour.ranks[{rank}]: a rank >= 0 whose behaviour has "
                                 f"no ranks of its own, got {b!r}")

    def for_rank(self, rank: int) -> SimBehaviour:
        return self.ranks.get(rank, self)


# Per job and attempt: what it acts out (None: the default model).
Behaviour = Callable[[Job, int], SimBehaviour | None]


@dataclass(frozen=True, slots=True)
class GangEnd:
    """How a gang's attempt ends (`gang_end`)."""

    at: float  # when the last worker ended (inf: only a stop could end it)
    exit_code: int | None  # None: lost
    message: str
    worker_end: tuple[float, ...]  # when each worker ended, by rank
    honoured: tuple[bool, ...]  # per stop: some worker ended on its SIGTERM


def gang_end(ends: Sequence[tuple[float, int | None]], ignore_term: Sequence[bool],
             stops: Sequence[tuple[float, float]], *, gang_grace_s: float) -> GangEnd:
    """How an attempt ends, as the local runtime ends one. `ends[r]` is when worker r ends on its
    own and with what code (None: it vanishes); `stops` are the stops asked for, (time, grace)
    in time order. A worker that fails (a non-zero code, or vanished) has the others stopped
    with `gang_grace_s`. A stop's SIGTERM ends at once every worker that honours it (143), the
    SIGKILL `grace` later the others (137); a grace of 0 is the SIGKILL at once. At one instant,
    workers ending on their own come first, then a stop, then a kill."""
    n = len(ends)
    alive = set(range(n))
    by_end = sorted(range(n), key=lambda r: (ends[r][0], r))
    worker_end = [math.inf] * n
    ended: list[tuple[int, int | None]] = []  # (rank, code) in the order they ended
    honoured = [False] * len(stops)
    kill_at, reason, i, si = math.inf, "", 0, 0

    def finish(rank: int, t: float, code: int | None) -> None:
        alive.discard(rank)
        worker_end[rank] = t
        ended.append((rank, code))

    def term(t: float, grace: float) -> bool:
        nonlocal kill_at
        hit = False
        for r in sorted(alive):
            if grace <= 0:
                finish(r, t, KILLED_EXIT_CODE)
            elif not ignore_term[r]:
                finish(r, t, STOPPED_EXIT_CODE)
                hit = True
        if grace > 0:
            kill_at = min(kill_at, t + grace)
        return hit

    while alive:
        while by_end[i] not in alive:
            i += 1
        t_own = ends[by_end[i]][0]
        t_stop = stops[si][0] if si < len(stops) else math.inf
        t = min(t_own, t_stop, kill_at)
        if math.isinf(t):
            break
        if t_own == t:
            rank, code = by_end[i], ends[by_end[i]][1]
            finish(rank, t, code)
            if code != 0 and alive and not reason:
                what = "vanished" if code is None else f"exited with {code}"
                reason = f"rank {rank} {what}; the other workers were stopped"
                term(t, gang_grace_s)
        elif t_stop == t:
            grace = stops[si][1]
            reason = reason or f"stopped (SIGTERM, SIGKILL after {grace:g}s)"
            honoured[si] = term(t, grace)
            si += 1
        else:
            for r in sorted(alive):
                finish(r, t, KILLED_EXIT_CODE)
    lost = next((r for r, code in ended if code is None), None)
    code = None if lost is not None else next((c for _, c in ended if c), 0)
    message = f"rank {lost} vanished" if lost is not None else reason
    return GangEnd(math.inf if alive else max(worker_end), code, message, tuple(worker_end),
                   tuple(honoured))

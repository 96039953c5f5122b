"""How a job's work progresses in virtual time: the model the simulated runtime
(`plinth.runtime.sim`) runs jobs by, and the cadence the owner (`plinth.sched.owner`) counts
their saves by. Pure: the scheduler's config builds a `WorkModel` (`SchedConfig.work_model`), so
that the runtime needs nothing of `sched`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from plinth.core.resources import Allocation
from plinth.core.workload import Job

# Units of work per second of a job's attempt on an allocation, with the GPU model it was
# placed for (None: no GPU).
Speed = Callable[[Job, Allocation, "str | None"], float]


def unit_speed(job: Job, allocation: Allocation, model: str | None) -> float:
    """Every job runs at the reference speed."""
    return 1.0


@dataclass(frozen=True, slots=True)
class WorkModel:
    """What a simulated attempt does with its time: works at `speed`, pays `restore_overhead`
    seconds before it resumes from a checkpoint, and saves every `checkpoint_interval` units
    of work (0: it saves whenever it is stopped; inf: never)."""

    speed: Speed = unit_speed
    restore_overhead: float = 30.0
    checkpoint_interval: float = 600.0


def periodic_checkpoint(progress: float, saved: float, every: float) -> float:
    """The progress saved by a job that checkpoints every `every` units of work (at multiples
    of `every`), given what it had saved before. Shared by the simulated runtime and the owner,
    so that the owner's view and the simulated process agree exactly."""
    if progress - saved >= every:
        return math.floor(progress / every) * every
    return saved

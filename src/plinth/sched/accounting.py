"""A launched attempt's accounting: how far a job has got (progress, at its rate), the GPU
seconds it has attained, how long it has run, and the checkpoints a declared cadence saved.
The owner keeps one `Run` a launched job and brings every running job up to date each pass."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from plinth.sched.types import JobState


@dataclass(slots=True)
class Run:
    """The current attempt's accounting, from its launch."""

    start: float  # launched
    t0: float  # progress begins
    rate: float
    every: float  # declared checkpoint cadence (0: reported as events)
    base_progress: float
    base_attained: float
    base_executed: float
    gpus: float

    def progress_at(self, t: float, duration: float) -> float:
        ran = t - self.t0
        return min(duration, self.base_progress + self.rate * ran if ran > 0 else
                   self.base_progress)


def account(jobs: Iterable[tuple[JobState, Run, float]], now: float) -> None:
    """Bring launched `jobs` (each with its run and duration) up to date at `now`."""
    # Hot: every pass brings every running job up to date. The loop, `Run.progress_at` and
    # `periodic_checkpoint` are written out here for that reason.
    floor = math.floor
    for js, run, duration in jobs:
        ran = now - run.t0
        progress = run.base_progress + run.rate * ran if ran > 0 else run.base_progress
        js.progress = progress = progress if progress < duration else duration
        ran = now - run.start
        js.attained = run.base_attained + run.gpus * ran
        js.executed = run.base_executed + ran
        every = run.every
        if every > 0 and progress - js.checkpointed >= every:
            saved = floor(progress / every) * every
            js.checkpointed = saved
            js.checkpoint_time = run.t0 + (saved - run.base_progress) / run.rate

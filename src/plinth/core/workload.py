"""Workloads as the scheduler sees them."""

from __future__ import annotations

from dataclasses import dataclass

from plinth.core.resources import Request


@dataclass(slots=True)
class Job:
    """One submitted job. `duration` is its run time on its request at reference speed (V100,
    consolidated); the simulator uses it as ground truth, oracle policies may peek at it."""

    id: int
    submit_time: float
    duration: float
    request: Request
    name: str = ""
    tenant: str = "default"
    priority: int = 0
    preemptible: bool = True
    job_type: str = ""  # for throughput matrices (Gavel); empty = use GPU model speed
    time_limit: float | None = None  # the user's estimate, as Slurm's --time; used by backfill
    retries: int = 0  # a run that fails (exit code not 0) is requeued this many times
    source_line: int = 0  # line in the trace file it came from, for error messages
    # Slurm's --dependency: (kind, job id), kind one of after, afterany, afterok, afternotok;
    # an array's id stands for all its tasks. The owner holds the job until they are met.
    dependencies: tuple[tuple[str, int], ...] = ()
    array_id: int | None = None  # a task of this array (its first task's id)
    array_limit: int | None = None  # at most this many of its array's tasks at once (`%N`)

    @property
    def estimate(self) -> float:
        """The run time a non-oracle policy may plan with."""
        return self.time_limit if self.time_limit is not None else self.duration

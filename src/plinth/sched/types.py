"""What the scheduler reads (a snapshot) and what it returns (decisions with reasons)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from plinth.core.lifecycle import State
from plinth.core.progress import WorkModel
from plinth.core.resources import MILLI, Allocation, Cluster
from plinth.core.throughput import DEFAULT_THROUGHPUTS, FIXED_SPEED, Throughputs
from plinth.core.workload import Job
from plinth.sched.placement import DEFAULT_PLACEMENT, PlacementConfig, locality_factor
from plinth.sched.state import ClusterState

if TYPE_CHECKING:
    from plinth.sched.ends import RunningEnds


@dataclass(slots=True, eq=False)  # identity equality: queues remove by identity
class JobState:
    """A job's scheduling state. Its owner (`plinth.sched.owner.Owner`) keeps `progress` and
    `attained` current before each scheduling pass. `status` is the job's lifecycle state; a
    job being stopped to be requeued (STOPPING) is already back in the pending queue, as the
    scheduler planned it."""

    job: Job
    status: State = State.PENDING
    allocation: Allocation | None = None
    start_time: float | None = None  # start of the current run
    first_start: float | None = None
    end_time: float | None = None
    progress: float = 0.0  # work done, in seconds at reference speed
    checkpointed: float = 0.0  # progress saved by the last checkpoint
    checkpoint_time: float | None = None  # when that checkpoint was written
    checkpoint_step: int | None = None  # the step the job reported for it (platform jobs)
    attempt: int = 0  # runs launched so far
    attained: float = 0.0  # GPU-seconds of service received (Tiresias)
    executed: float = 0.0  # wall seconds spent running, all runs together
    rate: float = 0.0  # progress per second in the current run
    preemptions: int = 0
    last_preempted: float | None = None
    pending_since: float = 0.0
    model: str | None = None  # GPU model of the current run
    reason: str = ""
    id: int = field(init=False)  # the job's id, copied: hot loops read it millions of times

    def __post_init__(self) -> None:
        self.id = self.job.id

    @property
    def remaining(self) -> float:
        """True remaining work (oracle)."""
        return max(0.0, self.job.duration - self.progress)

    @property
    def remaining_estimate(self) -> float:
        return max(0.0, self.job.estimate - self.progress)

    @property
    def unsaved(self) -> float:
        """Work lost if preempted now."""
        return self.progress - self.checkpointed

    def expected_end(self, now: float) -> float:
        rate = self.rate if self.rate > 0 else 1.0
        return now + self.remaining_estimate / rate


@dataclass(frozen=True, slots=True)
class SchedConfig:
    placement: PlacementConfig = DEFAULT_PLACEMENT
    backfill_depth: int = 500  # as Slurm's bf_max_job_test
    min_runtime: float = 300.0  # a job runs at least this long before it may be preempted
    preempt_backoff: float = 2.0  # min_runtime grows by this factor with each preemption
    max_preemptions: int = 8  # after this many, a job is no longer preempted
    restore_overhead: float = 30.0  # seconds to restart from a checkpoint (simulator)
    checkpoint_interval: float = 600.0  # seconds of progress between checkpoints (simulator)
    round_s: float = 360.0  # lease length for round-based policies (Gavel, Themis)
    throughputs: Throughputs = DEFAULT_THROUGHPUTS  # job type x GPU model speeds

    def work_model(self, cluster: Cluster) -> WorkModel:
        """How the simulated runtime runs jobs on `cluster` under this config: at the
        throughput model's speed for the job's type and GPU model, times the gang's locality
        (no locality for fixed-speed jobs: their durations were observed as they ran, so they
        already hold the cost of where they ran)."""
        thr, placement = self.throughputs, self.placement

        def speed(job: Job, allocation: Allocation, model: str | None) -> float:
            jtype = thr.type_of(job)
            return thr.speed(jtype, model) * (
                1.0 if jtype == FIXED_SPEED else locality_factor(cluster, allocation, placement))

        return WorkModel(speed, self.restore_overhead, self.checkpoint_interval)


@dataclass(slots=True)
class Snapshot:
    """The world as the scheduler sees it. `pending` is ordered by the policy's `order` key."""

    cluster: Cluster
    state: ClusterState
    pending: Sequence[JobState]
    running: Mapping[int, JobState]
    config: SchedConfig = field(default_factory=SchedConfig)
    # The running jobs by expected end, kept by the owner (None: built from `running`).
    ends: RunningEnds | None = None
    # The jobs queued since the previous pass, when nothing else changed since: no resources
    # freed, no timer fired, the same cluster and policy (None: anything may have changed).
    # A policy may then read only these (Kueue's set-aside of inadmissible workloads).
    arrived: Sequence[JobState] | None = None


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    allocation: Allocation
    reason: str
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: int
    reason: str
    checkpoint: bool = False  # the job saves its state first (a lease ending), losing nothing


@dataclass(frozen=True, slots=True)
class Resize:
    """Move a running job to a new allocation (a Gavel lease on another GPU model)."""

    job_id: int
    allocation: Allocation
    reason: str
    model: str | None = None


@dataclass(slots=True)
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)
    # Why examined pending jobs wait; a policy may leave out a job whose `reason` is that already.
    waiting: dict[int, str] = field(default_factory=dict)
    wake_at: float | None = None  # call me again then, even if nothing else happens

    def __bool__(self) -> bool:
        """True when the pass changes anything (reasons and wake-ups alone do not)."""
        return bool(self.starts or self.preempts or self.resizes)


def check_gang(js: JobState) -> None:
    """Assert that a running job's allocation is its whole gang, slot by slot (`validate`)."""
    req, alloc = js.job.request, js.allocation
    assert alloc is not None and len(alloc.slots) == req.workers, \
        f"job {js.id}: gang of {req.workers} got {0 if alloc is None else len(alloc.slots)} slots"
    for slot in alloc.slots:
        gpus = req.gpus if req.gpus else (1 if req.gpu_milli else 0)
        milli = MILLI if req.gpus else req.gpu_milli
        assert len(slot.gpus) == gpus and (not gpus or slot.milli == milli), \
            f"job {js.id}: slot {slot} does not match its request {req}"

"""What the owner of scheduling state (`plinth.sched.owner.Owner`) takes and gives: the events
a shell reports, and the output of a step (transitions for the store, instructions for the
runtime, rejected events with one-line reasons)."""

from __future__ import annotations

from dataclasses import dataclass, field

from plinth.core.lifecycle import State, StopReason
from plinth.core.resources import Allocation
from plinth.core.workload import Job
from plinth.sched.types import JobState

# --- events in ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submitted:
    job: Job


@dataclass(frozen=True, slots=True)
class Cancelled:
    job_id: int
    message: str = "cancelled by the user"


@dataclass(frozen=True, slots=True)
class Started:
    """The runtime has the attempt running. Progress begins at `at` (after any restore) at
    `rate` units of work per second. `checkpoint_every` declares a fixed checkpoint cadence in
    units of work (the simulated runtime's model), so that periodic checkpoints need no event
    each; runtimes that observe real checkpoints report them as `CheckpointSaved` instead."""

    job_id: int
    attempt: int
    at: float
    rate: float = 1.0
    checkpoint_every: float = 0.0


@dataclass(frozen=True, slots=True)
class Exited:
    job_id: int
    attempt: int
    exit_code: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class Lost:
    job_id: int
    attempt: int
    message: str = "processes vanished"


@dataclass(frozen=True, slots=True)
class LaunchFailed:
    job_id: int
    attempt: int
    message: str
    requeue: bool = False  # the cluster's fault (core.errors.Unavailable), not the job's


@dataclass(frozen=True, slots=True)
class CheckpointSaved:
    job_id: int
    attempt: int
    at: float
    step: int | None = None


Event = Submitted | Cancelled | Started | Exited | Lost | LaunchFailed | CheckpointSaved

# --- out ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    job_id: int
    attempt: int
    allocation: Allocation
    reason: str
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """SIGTERM, then kill after the shell's grace period. With `checkpoint` the job is asked to
    save first (a lease ending, a move), and loses nothing; otherwise it loses the work since
    its last checkpoint."""

    job_id: int
    attempt: int
    reason: StopReason
    message: str
    checkpoint: bool = False


Instruction = Launch | Stop


@dataclass(frozen=True, slots=True)
class Transition:
    """One lifecycle move. `fields` are the job's columns that change with it (as the store
    names them; `allocation` is an Allocation or None)."""

    job_id: int
    old: State
    new: State
    at: float
    kind: str
    message: str
    fields: dict


@dataclass(frozen=True, slots=True)
class Rejected:
    event: object
    code: str  # "not-found", "conflict" or "stale"
    message: str


@dataclass(slots=True)
class Output:
    transitions: list[Transition] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    checkpoints: list[JobState] = field(default_factory=list)  # jobs whose checkpoint moved
    policy_s: float = 0.0  # seconds the policy took in this step
    held_examined: int = 0  # held jobs looked at in this step (the cost of the holds)


def event_kind(ev: object) -> str:
    """What a reported event is, in words, for a rejection's message."""
    return {"CheckpointSaved": "checkpoint report", "Started": "start report",
            "Exited": "exit report", "Lost": "loss report",
            "LaunchFailed": "launch failure"}.get(type(ev).__name__, type(ev).__name__)

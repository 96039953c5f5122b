"""A job's lifecycle: its states and the only transitions allowed between them.

```
          submit                 start                 exit 0
  (new) ─────────► pending ───────────────► running ──────────► succeeded
                    ▲  │                     │  │  │ exit ≠ 0
                    │  │ cancel              │  │  └─────────► failed
                    │  └────────► cancelled  │  │
                    │                        │  │ cancel / preempt / time limit
                    │  lost, preempted,      │  ▼
                    └── or failed with ──────┴─ stopping ──► cancelled | timeout | (pending)
                        retries left
```

The one owner of scheduling state (`plinth.sched.owner`) makes every move through
`check_transition`, in the simulator and on the platform alike; the control plane writes each
one to the store in one transaction together with the event that explains it. A job that can
never fit the cluster is `rejected` before it is ever pending (the simulator's `reject_unfit`).
"""

from __future__ import annotations

import enum

from plinth.core.errors import PlinthError


class State(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"  # SIGTERM sent (cancel, preemption, time limit); waiting for the exit
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    REJECTED = "rejected"  # never admitted: it cannot fit the cluster

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """Holding resources on the cluster."""
        return self in (State.RUNNING, State.STOPPING)


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.TIMEOUT,
                      State.REJECTED})


class StopReason(enum.Enum):
    """Why a running job was asked to stop; it decides where the job goes when it exits."""

    CANCEL = "cancel"
    PREEMPT = "preempt"
    TIMEOUT = "timeout"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.RUNNING, State.CANCELLED, State.FAILED}),
    State.RUNNING: frozenset({State.STOPPING, State.SUCCEEDED, State.FAILED, State.PENDING}),
    # A stopping job may also exit on its own before the signal lands.
    State.STOPPING: frozenset({State.CANCELLED, State.TIMEOUT, State.PENDING, State.SUCCEEDED,
                               State.FAILED}),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
    State.TIMEOUT: frozenset(),
    State.REJECTED: frozenset(),
}


class IllegalTransition(PlinthError):
    pass


def check_transition(job_id: int, old: State, new: State) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"job {job_id}: cannot go from {old.value} to {new.value}")


def after_stop(reason: StopReason) -> State:
    """Where a job that was asked to stop goes when it exits."""
    return {StopReason.CANCEL: State.CANCELLED, StopReason.TIMEOUT: State.TIMEOUT,
            StopReason.PREEMPT: State.PENDING}[reason]

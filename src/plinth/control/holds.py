"""Jobs the control plane holds back from the scheduler: dependencies and array throttles.

A held job is stored as pending, with a reason that says what it waits for, but the owner
(plinth.sched.owner) has not seen it: it is submitted to the owner once it may run. So the
scheduler's pending set holds only jobs that could start now, as with Slurm, where a job held on
a dependency is not considered by the scheduler at all.

- Dependencies, as Slurm's ``--dependency``: ``after`` (the job has started, or ended),
  ``afterany`` (ended), ``afterok`` (succeeded), ``afternotok`` (ended without success). A
  dependency that can no longer be met (``afterok`` on a job that failed) cancels the job, as
  Slurm does with ``kill_invalid_depend``.
- Array throttles, ``array: 0-99%10``: at most 10 tasks of the array are with the scheduler
  (pending there, running or stopping) at a time; the next task goes when one ends.

`release` is a pure function of the holds and of what it is told about other jobs' states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from plinth.control.spec import JobSpec, parse_array
from plinth.core.workload import Job
from plinth.sched.lifecycle import State

# (state, has started at least once) of a job, or None if there is no such job.
StateOf = Callable[[int], "tuple[State, bool] | None"]


def verdict(kind: str, state: State, started: bool) -> bool | None:
    """Whether a dependency of `kind` on a job in `state` is met (True), can never be (False),
    or not yet (None)."""
    if kind == "after":
        return True if started or state.terminal else None
    if not state.terminal:
        return None
    if kind == "afterany":
        return True
    return (state is State.SUCCEEDED) == (kind == "afterok")


def array_limit(spec: JobSpec) -> int | None:
    return parse_array(spec.array)[1] if spec.array else None


@dataclass(slots=True)
class Holds:
    jobs: dict[int, tuple[Job, JobSpec]] = field(default_factory=dict)  # held, in id order
    reasons: dict[int, str] = field(default_factory=dict)
    active: dict[int, set[int]] = field(default_factory=dict)  # array id -> tasks let go
    dirty: bool = False  # something changed that may let a held job go

    def needs_hold(self, spec: JobSpec) -> bool:
        return bool(spec.dependencies()) or array_limit(spec) is not None

    def hold(self, job: Job, spec: JobSpec) -> None:
        self.jobs[job.id] = (job, spec)
        self.reasons[job.id] = "held: waiting for its turn"
        self.dirty = True

    def let_go(self, job_id: int, spec: JobSpec) -> None:
        """`job_id` is with the scheduler now (released, or recovered as started before)."""
        if spec.array_id is not None and array_limit(spec) is not None:
            self.active.setdefault(spec.array_id, set()).add(job_id)

    def ended(self, job_id: int, spec: JobSpec | None) -> None:
        """A job has ended (or was cancelled): it may free a dependency or an array slot."""
        if spec is not None and spec.array_id is not None:
            self.active.get(spec.array_id, set()).discard(job_id)
        self.jobs.pop(job_id, None)
        self.reasons.pop(job_id, None)
        self.dirty = True

    def release(self, state_of: StateOf
                ) -> tuple[list[tuple[Job, JobSpec]], list[tuple[int, str]]]:
        """(held jobs that may go to the scheduler now, (job id, why) of held jobs whose
        dependencies can never be met). Both are removed from the holds."""
        self.dirty = False
        go: list[tuple[Job, JobSpec]] = []
        never: list[tuple[int, str]] = []
        for job_id, (job, spec) in list(self.jobs.items()):
            waiting = []
            for kind, dep in spec.dependencies():
                found = state_of(dep)
                met = verdict(kind, *found) if found is not None else False
                if met is False:
                    what = "does not exist" if found is None else f"ended {found[0].value}"
                    why = f"dependency never satisfied: {kind}:{dep} (job {dep} {what})"
                    never.append((job_id, why))
                    break
                if met is None:
                    waiting.append(f"{kind}:{dep} ({found[0].value})")  # type: ignore[index]
            else:
                limit = array_limit(spec)
                busy = len(self.active.get(spec.array_id, ())) if limit is not None else 0
                if waiting:
                    self.reasons[job_id] = f"held: dependency {', '.join(waiting)}"
                elif limit is not None and busy >= limit:
                    self.reasons[job_id] = (f"held: array {spec.array_id} runs at most {limit} "
                                            "tasks at a time")
                else:
                    go.append((job, spec))
                    self.let_go(job_id, spec)
        for job, _ in go:
            del self.jobs[job.id]
            self.reasons.pop(job.id, None)
        for job_id, _ in never:
            del self.jobs[job_id]
            self.reasons.pop(job_id, None)
        return go, never

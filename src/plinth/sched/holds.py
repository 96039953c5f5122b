"""Jobs the owner holds back from the policy: dependencies and array throttles.

A held job is the owner's (plinth.sched.owner): PENDING, stored as such by the control plane,
with a reason that says what it waits for (`reason`). But it is not in the policy's queue: it
goes there once it may run. So the scheduler's pending set holds only jobs that could start now,
as with Slurm, where a job held on a dependency is not considered by the scheduler at all; and a
replay in the simulator holds jobs back exactly as the platform does.

- Dependencies, as Slurm's ``--dependency``: ``after`` (the job has started, or ended),
  ``afterany`` (ended), ``afterok`` (succeeded), ``afternotok`` (ended without success). A
  dependency that can no longer be met (``afterok`` on a job that failed) cancels the job, as
  Slurm does with ``kill_invalid_depend``. An array's id stands for all its tasks: its state is
  theirs together (`ArrayTally`).
- Array throttles, ``array: 0-99%10``: at most 10 tasks of the array are with the scheduler
  (pending there, running or stopping) at a time; the next task goes when one ends.

The owner tells the holds of every job that may matter to them (`submitted`, `moved`) and calls
`release` when something changed (`dirty`). `release` is a pure function of the holds and of
what `state_of` says about other jobs. It costs what changed since the last call, not what is
held: a held job is looked at when it is new, when a job it waits on changed state, or when its
array has a free slot; why a job waits is worked out when someone asks (`reason`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from plinth.core.lifecycle import State
from plinth.core.workload import Job

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


def array_state(ended: bool, failed: bool, started: bool) -> tuple[State, bool]:
    """An array's state as its dependents see it: SUCCEEDED once all its tasks have ended and
    all succeeded, FAILED once all have ended otherwise, RUNNING once one has started, else
    PENDING; and whether one has started."""
    if ended:
        return (State.FAILED if failed else State.SUCCEEDED), started
    return (State.RUNNING if started else State.PENDING), started


@dataclass(slots=True)
class ArrayTally:
    """An array with tasks in the owner: how many have not ended, and what the others did
    (tasks that ended before a restart count through `Holds.seed`)."""

    active: int = 0
    failed: bool = False  # a task ended without success
    started: bool = False  # a task has started

    def state(self) -> tuple[State, bool]:
        return array_state(self.active == 0, self.failed, self.started)


@dataclass(slots=True)
class Held:
    """A held job. `unmet`: its dependencies not met yet, None until they are first looked at;
    empty once all are met, when only its array's throttle holds it."""

    job: Job
    unmet: set[tuple[str, int]] | None = None


@dataclass(slots=True)
class Turns:
    """A throttled array: the limit (parsed once), its tasks with the scheduler, and a heap of
    its held tasks whose dependencies are met, lowest id first. A task cancelled while in the
    heap stays there until popped (and is skipped), so a cancel costs O(1) here."""

    limit: int
    active: set[int] = field(default_factory=set)
    ready: list[int] = field(default_factory=list)
    held: int = 0  # its tasks in the holds


@dataclass(slots=True)
class Holds:
    """Indexed so that a `release` costs what changed, not what is held: a held job is looked at
    when it is new, when a job it depends on changed state (`waiters`), or when its array freed
    a slot (`Turns.ready`). A 10,000-task `%1` array costs one pop per task that ends."""

    jobs: dict[int, Held] = field(default_factory=dict)
    arrays: dict[int, Turns] = field(default_factory=dict)  # throttled arrays by id
    tallies: dict[int, ArrayTally] = field(default_factory=dict)  # arrays with tasks here
    # dependency job id -> kind -> held jobs waiting on it (an array's id stands for its tasks)
    waiters: dict[int, dict[str, set[int]]] = field(default_factory=dict)
    dep_state: dict[int, str] = field(default_factory=dict)  # a waited-on job's state, last seen
    fresh: list[int] = field(default_factory=list)  # held since the last release, not looked at
    touched: set[int] = field(default_factory=set)  # waited-on jobs that changed state
    freed: set[int] = field(default_factory=set)  # arrays with a free slot or a task newly ready
    examined: int = 0  # held jobs the last `release` looked at: the cost of a step

    @property
    def dirty(self) -> bool:
        """Something changed that may let a held job go."""
        return bool(self.fresh or self.touched or self.freed)

    @property
    def reasons(self) -> Mapping[int, str]:
        """Why each held job waits, worked out when asked (see `reason`)."""
        return _Reasons(self)

    def reason(self, job_id: int) -> str | None:
        h = self.jobs.get(job_id)
        if h is None:
            return None
        if h.unmet is None:
            return "held: waiting for its turn"
        if h.unmet:
            waiting = [f"{kind}:{dep} ({self.dep_state.get(dep, '?')})"
                       for kind, dep in h.job.dependencies if (kind, dep) in h.unmet]
            return f"held: dependency {', '.join(waiting)}"
        # Read without the loop's lock (the API's `show`): the array may have just ended.
        turns = self.arrays.get(h.job.array_id)  # type: ignore[arg-type]  # a throttled task
        limit = turns.limit if turns is not None else h.job.array_limit
        return f"held: array {h.job.array_id} runs at most {limit} tasks at a time"

    @staticmethod
    def needs_hold(job: Job) -> bool:
        """Whether a job that has never run waits here first."""
        return bool(job.dependencies) or job.array_limit is not None

    @staticmethod
    def concerns(job: Job) -> bool:
        """Whether the holds follow `job` (`submitted`, `moved`): a task of an array, or a job
        with dependencies. Others matter only once a held job waits on them (`waiters`)."""
        return bool(job.dependencies) or job.array_id is not None

    # --- what the owner tells -----------------------------------------------------------------

    def submitted(self, job: Job, held: bool) -> None:
        """`job` is new to the owner (or taken back after a restart, not ended): held here, or
        with the scheduler."""
        if job.array_id is not None:
            tally = self.tallies.get(job.array_id)
            if tally is None:
                tally = self.tallies[job.array_id] = ArrayTally()
            tally.active += 1
        if held:
            self._hold(job)
        else:
            self._let_go(job)

    def seed(self, array_id: int, failed: bool, started: bool) -> None:
        """What an array's tasks that ended before a restart did (the owner has only the
        others)."""
        tally = self.tallies.get(array_id)
        if tally is None:
            tally = self.tallies[array_id] = ArrayTally()
        tally.failed |= failed
        tally.started |= started

    def moved(self, job: Job, new: State) -> None:
        """A job of the owner moved to `new`: jobs waiting on it (or on its array) look again;
        an ended one leaves the holds, and frees its array's slot."""
        aid = job.array_id
        if aid is not None:
            tally = self.tallies.get(aid)
            if tally is not None:
                if new is State.RUNNING:
                    tally.started = True
                elif new.terminal:
                    tally.active -= 1
                    tally.failed |= new is not State.SUCCEEDED
            if aid in self.waiters:
                self.touched.add(aid)
        if job.id in self.waiters:
            self.touched.add(job.id)
        if new.terminal:
            self._ended(job)

    def drop_ended_arrays(self) -> None:
        """Forget the arrays whose tasks have all ended (an owner that keeps no finished jobs:
        its shell's record answers for them from then on)."""
        for aid in [a for a, t in self.tallies.items() if t.active <= 0]:
            del self.tallies[aid]

    # --- internals ----------------------------------------------------------------------------

    def _hold(self, job: Job) -> None:
        self.jobs[job.id] = Held(job)
        if job.array_limit is not None and job.array_id is not None:
            turns = self.arrays.get(job.array_id)
            if turns is None:
                turns = self.arrays[job.array_id] = Turns(job.array_limit)
            turns.held += 1
        self.fresh.append(job.id)

    def _let_go(self, job: Job) -> None:
        """`job` is with the scheduler (released, or taken back as started before)."""
        if job.array_limit is not None and job.array_id is not None:
            turns = self.arrays.get(job.array_id)
            if turns is None:
                turns = self.arrays[job.array_id] = Turns(job.array_limit)
            turns.active.add(job.id)

    def _ended(self, job: Job) -> None:
        """A job has ended (or was cancelled): it may free an array slot."""
        h = self.jobs.pop(job.id, None)
        if h is not None:
            self._forget(h)
        array_id = job.array_id
        turns = self.arrays.get(array_id) if array_id is not None else None
        if turns is not None:
            if job.id in turns.active:
                turns.active.discard(job.id)
                self.freed.add(array_id)  # type: ignore[arg-type]
            if h is not None:
                turns.held -= 1
            if not turns.held and not turns.active:
                del self.arrays[array_id]  # type: ignore[arg-type]
                self.freed.discard(array_id)  # type: ignore[arg-type]

    def release(self, state_of: StateOf) -> tuple[list[Job], list[tuple[int, str]]]:
        """(held jobs that may go to the scheduler now, removed from the holds; (job id, why)
        of held jobs whose dependencies can never be met, which leave once the owner has ended
        them), each in id order."""
        seen: dict[int, tuple[State, bool] | None] = {}

        def look(dep: int) -> tuple[State, bool] | None:
            found = seen[dep] if dep in seen else seen.setdefault(dep, state_of(dep))
            if dep in self.waiters:  # what its waiters' reasons name
                self.dep_state[dep] = found[0].value if found is not None else "gone"
            return found

        go: list[Held] = []
        never: dict[int, str] = {}
        fresh, touched, self.fresh, self.touched = self.fresh, self.touched, [], set()
        examined = len(fresh)
        for job_id in fresh:
            h = self.jobs.get(job_id)
            if h is None:  # cancelled before it was looked at
                continue
            h.unmet = set()
            for kind, dep in h.job.dependencies:
                self.waiters.setdefault(dep, {}).setdefault(kind, set()).add(job_id)
                h.unmet.add((kind, dep))
            why = self._settle(h, look)
            if why is not None:
                never[job_id] = why
            elif not h.unmet:
                self._ready(h, go)
        for dep in sorted(touched):
            kinds = self.waiters.get(dep)
            if kinds is None:
                continue
            found = look(dep)
            for kind, waiting in list(kinds.items()):
                met = verdict(kind, *found) if found is not None else False
                if met is None:  # their reasons name its new state (dep_state); nothing else
                    continue
                for job_id in sorted(waiting):
                    h = self.jobs.get(job_id)
                    if h is None or job_id in never or h.unmet is None:
                        continue
                    examined += 1
                    # a dependency that cannot be met: name the first such, in the spec's order
                    why = self._settle(h, look) if met is False else None
                    if why is not None:
                        never[job_id] = why
                        continue
                    h.unmet.discard((kind, dep))
                    self._unwait(job_id, kind, dep)
                    if not h.unmet:
                        self._ready(h, go)
        for array_id in sorted(self.freed):
            turns = self.arrays.get(array_id)
            while turns is not None and turns.ready and len(turns.active) < turns.limit:
                h = self.jobs.get(heapq.heappop(turns.ready))
                if h is not None and h.job.id not in never:
                    examined += 1
                    go.append(h)
                    turns.active.add(h.job.id)
        self.freed.clear()
        for h in go:
            del self.jobs[h.job.id]
            turns = self.arrays.get(h.job.array_id) if h.job.array_id is not None else None
            if turns is not None:
                turns.held -= 1
        self.examined = examined
        go.sort(key=lambda h: h.job.id)
        return [h.job for h in go], sorted(never.items())

    def _settle(self, h: Held, look: Callable[[int], tuple[State, bool] | None]) -> str | None:
        """Look at `h`'s unmet dependencies, in the spec's order: drop those met, and return
        why the first that never can be met cannot (None if none)."""
        for kind, dep in h.job.dependencies:
            if (kind, dep) not in h.unmet:  # type: ignore[operator]  # looked at: a set
                continue
            found = look(dep)
            met = verdict(kind, *found) if found is not None else False
            if met is False:
                what = "does not exist" if found is None else f"ended {found[0].value}"
                return f"dependency never satisfied: {kind}:{dep} (job {dep} {what})"
            if met:
                h.unmet.discard((kind, dep))  # type: ignore[union-attr]
                self._unwait(h.job.id, kind, dep)
        return None

    def _ready(self, h: Held, go: list[Held]) -> None:
        """`h`'s dependencies are all met: it goes, or waits for its array's turn."""
        turns = self.arrays.get(h.job.array_id) if h.job.array_id is not None else None
        if turns is None:
            go.append(h)
            return
        heapq.heappush(turns.ready, h.job.id)
        self.freed.add(h.job.array_id)  # type: ignore[arg-type]

    def _unwait(self, job_id: int, kind: str, dep: int) -> None:
        kinds = self.waiters.get(dep)
        if kinds is None:
            return
        waiting = kinds.get(kind)
        if waiting is not None:
            waiting.discard(job_id)
            if not waiting:
                del kinds[kind]
        if not kinds:
            del self.waiters[dep]
            self.dep_state.pop(dep, None)

    def _forget(self, h: Held) -> None:
        """`h` leaves the holds: it waits on nothing any more."""
        for kind, dep in h.unmet or ():
            self._unwait(h.job.id, kind, dep)


class _Reasons(Mapping[int, str]):
    """Held job id -> why it waits, each worked out when read."""

    __slots__ = ("holds",)

    def __init__(self, holds: Holds) -> None:
        self.holds = holds

    def __getitem__(self, job_id: int) -> str:
        why = self.holds.reason(job_id)
        if why is None:
            raise KeyError(job_id)
        return why

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.holds.jobs

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.holds.jobs))

    def __len__(self) -> int:
        return len(self.holds.jobs)

"""The one driver of the owner: the loop body that the control plane and the simulator share.

    driver = Driver(owner, runtime, clock=clock, launch_spec=spec_of, grace_s=10.0)
    driver.step([Submitted(job)])   # one turn at clock(): the runtime's reports and these

A turn takes the runtime's reports (as the owner's events) and what the shell adds
(submissions, cancels), steps the owner (`Owner.handle`: its transitions, a scheduling pass if
one is needed), and carries out its output through the runtime protocol: the shell's `record`
gets every output first (the control plane stores the transitions before anything runs, so
that a restart loses nothing), then the stops and launches go to the runtime, and what they
cause at once (a failed launch, a start, a stop that ended in virtual time) goes back to the
owner, until nothing is left to do. A launch's LaunchSpec comes from the shell (`launch_spec`):
the control plane's names a command, a log and a user; the simulator's only the workers.

The control plane (plinth.control.service) turns it on the wall clock with a real runtime, from
its loop thread, with passes spaced by a `Pacer`; the simulator (plinth.sim.engine) on a
virtual clock with the simulated runtime, every pass at once. `next_time` says when the next
turn is due for a virtual clock to jump to.

Launches off the loop: with `wake` given (the control plane's loop) and a runtime that says
"concurrent-launch" (Ray: a placement group and an actor per worker, seconds each), a turn
hands its launches to a pool of threads and goes on; no turn waits for a launch. A launch that
is done wakes the loop, and the next turn takes its result (the runtime's handle, recorded as
the job's `started`, or why it failed) before the runtime's reports. A stop for an attempt
whose launch is still on its way is carried out when the launch is done. Without `wake` (the
simulator, the tests' virtual platform) every launch is carried out within its turn.

It lives in `sched`, beside the owner it drives. It speaks to a runtime only through the
protocol in `plinth.core.runtime`, which lives in `core` for that reason: `sched` and
`runtime` are peers, neither imports the other, and the shells above both (`control`, `sim`)
hand it the runtime they built. So the one loop body serves every runtime and both clocks.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from plinth.core.errors import PlinthError, Unavailable
from plinth.core.runtime import EventKind, Handle, LaunchSpec, Runtime, RuntimeEvent
from plinth.sched.events import (
    CheckpointSaved,
    Event,
    Exited,
    Launch,
    LaunchFailed,
    Lost,
    Output,
    Started,
)
from plinth.sched.owner import Owner

log = logging.getLogger("plinth.control")

# At most this many launches of one batch at once, on a runtime that takes them concurrently.
LAUNCH_THREADS = 8


class Pacer:
    """Passes spaced by at least `min_interval_s`, or by nine times as long as the last pass
    took, on a monotonic clock: under a burst of submissions the scheduler takes at most a
    tenth of the process's time and each pass sees a batch of new jobs (Slurm's
    sched_min_interval plays the same role). An idle cluster is not delayed: the first pass
    after a quiet spell runs at once. Only the wall clock needs one: in virtual time a pass
    takes no time."""

    def __init__(self, min_interval_s: float = 0.005,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_interval_s, self.clock = min_interval_s, clock
        self.next_at = 0.0

    def wait_s(self) -> float:
        """How long until a pass may run (0: now)."""
        return max(0.0, self.next_at - self.clock())

    def passed(self, policy_s: float) -> None:
        self.next_at = self.clock() + max(self.min_interval_s, 9 * policy_s)


def launch_error(job_id: int, e: Exception) -> LaunchError:
    """One line on why a job's launch failed, and whether the cluster is at fault (the job is
    then requeued); an error that is not the platform's own (a bug, not bad input) is logged
    with its traceback."""
    if not isinstance(e, PlinthError):
        log.error("job %d: launch failed", job_id, exc_info=e)
        return LaunchError(f"{type(e).__name__}: {e}")
    return LaunchError(str(e), isinstance(e, Unavailable))


@dataclass(frozen=True, slots=True)
class LaunchError:
    message: str
    requeue: bool = False


class Driver:
    def __init__(self, owner: Owner, runtime: Runtime, *, clock: Callable[[], float],
                 launch_spec: Callable[[Launch], LaunchSpec], grace_s: float,
                 record: Callable[[Output], None] | None = None,
                 launched: Callable[[Launch, Handle], None] | None = None,
                 on_pass: Callable[[Output], None] | None = None,
                 pacer: Pacer | None = None, launch_threads: int = LAUNCH_THREADS,
                 wake: Callable[[], None] | None = None) -> None:
        """`record(out)`: the shell's, for every output before its instructions run;
        `launched(ins, handle)`: after each launch that worked; `on_pass(out)`: after each
        step of the owner that ran a pass; `pacer`: spaces the passes (None: each runs as soon
        as it is needed); `wake`: called from a launch thread when a launch is done (given,
        launches on a "concurrent-launch" runtime run off the loop)."""
        if not grace_s >= 0:
            raise ValueError(f"Driver: grace_s must be >= 0 seconds, got {grace_s!r}")
        self.owner, self.runtime, self.clock = owner, runtime, clock
        self.launch_spec, self.grace_s, self.pacer = launch_spec, grace_s, pacer
        self.record, self.launched, self.on_pass = record, launched, on_pass
        self.deferred: float | None = None  # a pass put off until then (pacer), on `clock`
        # Jobs whose attempt ended while no runtime watched, and when (the runtime's report).
        self.ended_at: dict[int, float] = {}
        self._threads = launch_threads
        self._next_event = getattr(runtime, "next_time", None)  # a virtual runtime's
        self._progress = "progress" in runtime.capabilities
        self._pool: ThreadPoolExecutor | None = None  # made at the first concurrent batch
        self._wake = wake if "concurrent-launch" in runtime.capabilities else None
        # Launches off the loop: those on their way (with, once a stop is asked for meanwhile,
        # whether it asks for a checkpoint), and those done, for the next turn to take.
        self._inflight: dict[tuple[int, int], bool | None] = {}
        self._done: queue.SimpleQueue[tuple[Launch, Handle | LaunchError]] = queue.SimpleQueue()

    # --- a turn -------------------------------------------------------------------------------

    def step(self, extra: Iterable[Event] = ()) -> None:
        """One turn at `clock()`: the runtime's reports, then `extra`."""
        now = self.clock()
        self.turn([*self.poll(now), *extra], now)

    def turn(self, events: list[Event], now: float) -> None:
        """Step the owner with `events` at `now` and carry out what it says."""
        self.carry_out(self._handle(events, now), now)

    def poll(self, now: float) -> list[Event]:
        """The launches done off the loop, then the runtime's reports since the last poll, as
        the owner's events."""
        return self.launches_done(now) + self.events(self.runtime.poll(), now)

    def launches_done(self, now: float) -> list[Event]:
        """The launches done off the loop since the last look, as the owner's events (a stop
        asked for meanwhile is sent now)."""
        out: list[Event] = []
        while not self._done.empty():
            ins, result = self._done.get()
            checkpoint = self._inflight.pop((ins.job_id, ins.attempt), None)
            if checkpoint is not None and not isinstance(result, LaunchError):
                self.runtime.stop(ins.job_id, ins.attempt, self.grace_s, checkpoint=checkpoint)
            ev = self._launched(ins, result, now)
            if ev is not None:
                out.append(ev)
        return out

    @property
    def launching(self) -> int:
        """Launches on their way, off the loop."""
        return len(self._inflight)

    def next_time(self) -> float | None:
        """When a turn is next due if nothing else comes: the owner's next timer, a pass put
        off, or (a runtime on a virtual clock) its next event."""
        t = self.owner.next_timer()
        if self.deferred is not None and (t is None or self.deferred < t):
            t = self.deferred
        if self._next_event is not None:
            e = self._next_event()
            if e is not None and (t is None or e < t):
                t = e
        return t

    def carry_out(self, out: Output, now: float) -> None:
        """Record `out`, then carry out its instructions; what they cause goes back to the
        owner, and so on until nothing is left to do."""
        runtime, grace = self.runtime, self.grace_s
        while True:
            if self.record is not None:
                self.record(out)
            if not out.instructions:
                return
            launches = []
            for ins in out.instructions:
                if type(ins) is Launch:
                    launches.append(ins)
                elif (ins.job_id, ins.attempt) in self._inflight:  # stopped when it is up
                    self._inflight[(ins.job_id, ins.attempt)] = ins.checkpoint
                else:
                    runtime.stop(ins.job_id, ins.attempt, grace,
                                 checkpoint=ins.checkpoint)  # type: ignore[union-attr]
            feedback: list[Event] = []
            if launches and self._wake is not None:
                feedback += self._launch_off_loop(launches, now)
            elif launches:
                for ins, result in zip(launches, self._launch_all(launches), strict=True):
                    ev = self._launched(ins, result, now)
                    if ev is not None:
                        feedback.append(ev)
            # On a wall clock the launches took time: what the runtime reports now happened
            # after this turn's pass, and is stepped (and stored) at the time it is seen, so
            # that the record keeps the order the owner saw things in (a replay of it decides
            # as the platform did). On a virtual clock it is the same instant.
            now = self.clock()
            feedback += self.poll(now)
            out = self._handle(feedback, now)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # --- the runtime's reports ----------------------------------------------------------------

    def events(self, reports: Iterable[RuntimeEvent], now: float) -> list[Event]:
        """Runtime reports as the owner's events."""
        out: list[Event] = []
        for ev in reports:
            kind = ev.kind
            if kind is EventKind.EXITED:
                if ev.at is not None:  # it ended while no runtime watched it
                    self.ended_at[ev.job_id] = ev.at
                out.append(Exited(ev.job_id, ev.attempt, ev.exit_code or 0, ev.message))
            elif kind is EventKind.STARTED:
                out.append(Started(ev.job_id, ev.attempt, now if ev.at is None else ev.at,
                                   ev.rate, ev.checkpoint_every))
            elif kind is EventKind.LOST:
                out.append(Lost(ev.job_id, ev.attempt, ev.message or "processes vanished"))
            elif kind is EventKind.CHECKPOINTED:
                out.append(CheckpointSaved(ev.job_id, ev.attempt,
                                           now if ev.at is None else ev.at, ev.step))
        return out

    # --- internals ----------------------------------------------------------------------------

    def _handle(self, events: list[Event], now: float) -> Output:
        """One step of the owner; a pass only if the pacer allows one now."""
        owner, pacer = self.owner, self.pacer
        wait = 0.0 if pacer is None else pacer.wait_s()
        passes = owner.passes
        out = owner.handle(events, now, schedule=wait <= 0)
        if wait <= 0:
            self.deferred = None  # a pass ran if one was needed
            if owner.passes != passes:
                if pacer is not None:
                    pacer.passed(out.policy_s)
                if self.on_pass is not None:
                    self.on_pass(out)
        elif owner.pass_needed(now):  # too soon after the last: come back then
            self.deferred = now + wait
        return out

    def _launched(self, ins: Launch, result: Handle | LaunchError, now: float) -> Event | None:
        # A failed launch is this job's alone: it becomes launch-failed (or is requeued, when
        # the cluster was at fault) and releases what it held, and the turn goes on.
        if isinstance(result, LaunchError):
            return LaunchFailed(ins.job_id, ins.attempt, result.message, result.requeue)
        if self.launched is not None:
            self.launched(ins, result)
        if self._progress:
            return None  # its STARTED report says when and how fast (see plinth.core.runtime)
        return Started(ins.job_id, ins.attempt, now)

    def _launch_all(self, launches: list[Launch]) -> list[Handle | LaunchError]:
        """Each launch's handle, or why it failed. A runtime that says "concurrent-launch"
        (Ray reserves a placement group and starts an actor per worker, seconds each) gets up
        to `launch_threads` at once, so the turn waits for the slowest rather than their sum;
        any other gets them one after another (the local runtime's are forks)."""
        specs = [self._spec_or_error(ins) for ins in launches]
        ready = [s for s in specs if isinstance(s, LaunchSpec)]
        if len(ready) > 1 and "concurrent-launch" in self.runtime.capabilities:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="plinth-launch")
            done = iter(list(self._pool.map(self._launch_one, ready)))
        else:
            done = iter([self._launch_one(s) for s in ready])
        return [next(done) if isinstance(s, LaunchSpec) else s for s in specs]

    def _launch_off_loop(self, launches: list[Launch], now: float) -> list[Event]:
        """Hand each launch to the pool; those whose spec cannot be made fail now."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="plinth-launch")
        failed = []
        for ins in launches:
            spec = self._spec_or_error(ins)
            if isinstance(spec, LaunchError):
                failed.append(self._launched(ins, spec, now))
                continue
            self._inflight[(ins.job_id, ins.attempt)] = None
            self._pool.submit(self._launch_done, ins, spec)
        return [ev for ev in failed if ev is not None]

    def _launch_done(self, ins: Launch, spec: LaunchSpec) -> None:
        """In a launch thread: launch, and hand the result to the loop."""
        self._done.put((ins, self._launch_one(spec)))
        self._wake()  # type: ignore[misc]

    def _spec_or_error(self, ins: Launch) -> LaunchSpec | LaunchError:
        try:
            return self.launch_spec(ins)
        except Exception as e:  # noqa: BLE001 -- this job's alone: it becomes launch-failed
            return launch_error(ins.job_id, e)

    def _launch_one(self, spec: LaunchSpec) -> Handle | LaunchError:
        try:
            return self.runtime.launch(spec)
        except Exception as e:  # noqa: BLE001 -- this job's alone: it becomes launch-failed
            return launch_error(spec.job_id, e)

"""The one owner of scheduling state: events and the time in, instructions for a runtime out.

The control plane (`plinth.control.service`) and the simulator (`plinth.sim.engine`) are thin
shells around this class: the control plane adds the store, the API, the wall clock and a real
runtime; the simulator adds a virtual clock and the simulated runtime (`plinth.runtime.sim`).
Neither applies a scheduling decision itself.

    out = owner.handle([Submitted(job), Exited(5, 1, 0), ...], now)
    out.transitions   # every lifecycle move, for the store (the control plane writes them)
    out.instructions  # Launch / Stop, for the runtime
    out.rejected      # events that could not be applied, each with a one-line reason

Two views of the cluster are kept:

- `state`, the plan. It is what the policy sees. A decision changes it at once: a preempted or
  cancelled job's resources are free in the plan as soon as the stop is decided, and a started
  job's are taken.
- `held`, what processes really hold. A job's resources are held from its Launch until the
  runtime reports it exited or lost.

A job started on resources that a stopping job still holds is RUNNING in the plan but waits for
its Launch until `held` has room, in the order the starts were decided. So a move to other GPUs
(Gavel's lease on another model) is a checkpoint-then-stop of the current attempt, and a Launch
of the next attempt on the new allocation once the old one has exited. A job stopped to be
requeued (preempted, moved) is back in the pending queue from the decision on: the policy
planned it so, and may start it again in the same pass.

Timers are the owner's too: time limits (`Job.time_limit`) and the policy's `wake_at` (a lease
or round ending). They fire on the first `handle` at or after them; `next_timer()` says when.

So are dependencies and array throttles (`plinth.sched.holds`): a job that waits on another, or
for its array's turn, is PENDING but held out of the policy's queue until it may run, and one
whose dependency can never be met is cancelled, as a transition like any other. The state of a
job the owner no longer holds (it keeps no finished jobs: the control plane) comes from
`lookup`, the shell's record.

`validate=True` checks the invariants after every step (tests and the simulator's checks):
nothing over-committed in either view, both views equal to the sum of their jobs' allocations,
gangs whole, every job in exactly one state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from sortedcontainers import SortedKeyList

from plinth.core.lifecycle import State, StopReason, check_transition
from plinth.core.resources import Allocation, Cluster
from plinth.core.workload import Job
from plinth.sched.accounting import Run, account
from plinth.sched.ends import RunningEnds
from plinth.sched.events import (  # noqa: F401 (the owner's vocabulary, imported from here too)
    Cancelled,
    CheckpointSaved,
    Event,
    Exited,
    Instruction,
    Launch,
    LaunchFailed,
    Lost,
    Output,
    Rejected,
    Started,
    Stop,
    Submitted,
    Transition,
    event_kind,
)
from plinth.sched.holds import Holds
from plinth.sched.invariants import check_owner
from plinth.sched.nodes import DownNodes, grown
from plinth.sched.policies.base import Policy
from plinth.sched.restore import Restoring
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot

WAITING_FOR_RELEASE = "started: waiting for stopping jobs to release its resources"


# The state of a job the owner does not hold (an array's id: of its tasks together), and whether
# it has started; None if there is no such job.
Lookup = Callable[[int], "tuple[State, bool] | None"]


class Owner(Restoring):
    def __init__(self, cluster: Cluster, policy: Policy, config: SchedConfig | None = None, *,
                 validate: bool = False, keep_finished: bool = True,
                 on_pass: Callable[[Decisions, float], None] | None = None,
                 lookup: Lookup | None = None) -> None:
        self.cluster, self.policy = cluster, policy
        self.config = config or SchedConfig()
        self.validate, self.keep_finished, self.on_pass = validate, keep_finished, on_pass
        self.lookup = lookup
        self.state = ClusterState(cluster)  # the plan
        self.held = ClusterState(cluster)  # what launched attempts hold
        self.down = DownNodes()  # nodes that left: held out of the plan
        self.jobs: dict[int, JobState] = {}  # active jobs (and finished ones if keep_finished)
        self.pending: SortedKeyList = policy.pending_queue()
        self.running: dict[int, JobState] = {}  # RUNNING in the plan (launched or not)
        self.ends = RunningEnds()  # the running jobs by expected end, for reservations
        self.waiting_launch: dict[int, JobState] = {}  # RUNNING, Launch held back for room
        self.runs: dict[int, Run] = {}
        # The launched RUNNING jobs with their runs and durations: what a pass brings up to date.
        self.accounted: dict[int, tuple[JobState, Run, float]] = {}
        self.next_start: dict[int, tuple[Allocation, str, str | None]] = {}  # stopping -> restart
        self.stop_why: dict[int, tuple[StopReason, bool]] = {}  # STOPPING: why, and saving?
        self.deadlines: dict[int, float] = {}
        self.wake_at: float | None = None
        self.holds = Holds()  # held PENDING jobs: dependencies, array throttles
        self._held_due: float | None = None  # held jobs to look at again from then
        self._gone: list[int] = []  # finished in this step: forgotten at its end
        self.passes = self.preemptions = 0
        self.lost_work = 0.0
        # What happened since the last pass, to decide whether one is worth running.
        self._freed = self._arrived = self._pass_due = False
        self._arrived_gpu_only = True
        # The jobs queued since the last pass (see `Snapshot.arrived`); None: unknown or unread.
        self._queued: list[JobState] | None = [] if policy.reads_arrivals else None
        self._touched_at = -math.inf
        self._out = Output()

    # --- the one entry point ------------------------------------------------------------------

    def handle(self, events: Iterable[Event], now: float, *, schedule: bool = True) -> Output:
        """Apply `events` at `now`, fire due timers, and (with `schedule`) run a scheduling pass
        if anything it could act on changed. Returns what the shells must carry out."""
        out = self._out
        for ev in events:
            self._on(ev, now)
        for jid in [j for j, t in self.deadlines.items() if now >= t]:
            js = self.running[jid]
            self._stop(js, now, StopReason.TIMEOUT,
                       f"time limit of {js.job.time_limit:g} s reached")
        if self.holds.dirty:
            self._release_held(now)
        if self.down.nodes:  # what jobs on a node that left released stays unplaceable
            self.down.take_free(self.state)
        if schedule and self.pass_needed(now):
            self._schedule(now)
        self._launch_waiting(now)
        self._end_step(now)
        if self.validate:
            self.check()
        self._out = Output()
        return out

    def pass_needed(self, now: float) -> bool:
        """Whether a pass could change anything: a timer is due, resources were freed in the
        plan, or jobs arrived that could start (under a non-preemptive policy, an arrival to a
        full cluster cannot)."""
        if self._pass_due or (self.wake_at is not None and now >= self.wake_at):
            return True
        preemptive = self.policy.preemptive
        if self._freed and (self.pending or preemptive):
            return True
        return self._arrived and (preemptive or not self._arrived_gpu_only
                                  or self.state.free_milli > 0)

    def next_timer(self) -> float | None:
        """When `handle` should next be called even if no event comes (at once, if a start
        or an end late in the last step may let held jobs go)."""
        t = min(self.deadlines.values(), default=math.inf)
        if self.wake_at is not None:
            t = min(t, self.wake_at)
        if self._held_due is not None:
            t = min(t, self._held_due)
        return None if math.isinf(t) else t

    def apply(self, d: Decisions, now: float) -> Output:
        """Apply one pass's decisions (as `handle` does after calling the policy)."""
        self._apply(d, now)
        self._launch_waiting(now)
        self._end_step(now)
        out, self._out = self._out, Output()
        return out

    def request_pass(self) -> None:
        """Run a pass at the next `handle`, whatever changed (a shell's last chance)."""
        self._pass_due = True

    def set_policy(self, policy: Policy, cluster: Cluster) -> None:
        """A new policy (tenant quotas changed); the nodes stay the same."""
        self.policy, self.cluster = policy, cluster
        self.state.cluster = self.held.cluster = cluster
        self.pending = policy.pending_queue(list(self.pending))
        self._pass_due = True

    def add_nodes(self, cluster: Cluster, policy: Policy) -> None:
        """Nodes joined: `cluster` is this one with them appended (so every index, of a node
        and of a GPU, stays what it was), and `policy` the policy for it. The plan and what
        launched attempts hold are rebuilt on it from the jobs (see plinth.sched.nodes)."""
        self.state, self.held = grown(self, cluster)
        self.set_policy(policy, cluster)

    def set_down(self, nodes: frozenset[int]) -> None:
        """The nodes (by index) that have left the cluster now; see plinth.sched.nodes."""
        if self.down.set(nodes, self.state):
            self._pass_due = True

    # --- events -------------------------------------------------------------------------------

    def _on(self, ev: Event, now: float) -> None:
        if type(ev) is Submitted:
            self._submit(ev.job)
            return
        js = self.jobs.get(ev.job_id)
        if js is None or js.status.terminal:
            code = "not-found" if js is None else "conflict"
            what = "not found" if js is None else f"has already finished ({js.status.value})"
            self._reject(ev, code, f"job {ev.job_id} {what}")
            return
        if type(ev) is Cancelled:
            self._cancel(js, now, ev.message)
            return
        if ev.attempt != js.attempt or js.id not in self.runs:
            self._reject(ev, "stale", f"job {js.id}: {event_kind(ev)} for attempt {ev.attempt} "
                         f"ignored: the job is {js.status.value}, attempt {js.attempt}"
                         + ("" if js.id in self.runs else ", not launched"))
            return
        if type(ev) is Started:
            run = self.runs[js.id]
            run.t0, run.rate, run.every = max(ev.at, run.start), ev.rate, ev.checkpoint_every
            js.rate = ev.rate
            if js.status is State.RUNNING:
                self.ends.add(js, run.t0, run.base_progress)
        elif type(ev) is CheckpointSaved:
            js.checkpointed = max(js.checkpointed,
                                  self.runs[js.id].progress_at(ev.at, js.job.duration))
            js.checkpoint_time, js.checkpoint_step = ev.at, ev.step
            self._out.checkpoints.append(js)
        elif type(ev) is Exited:
            self._exited(js, now, ev.exit_code, f"exit code {ev.exit_code}"
                         + (f" ({ev.message})" if ev.message else ""))
        elif type(ev) is Lost:
            self._exited(js, now, None, ev.message, kind="lost")
        elif type(ev) is LaunchFailed:
            self._exited(js, now, None, ev.message,
                         kind="launch-retry" if ev.requeue else "launch-failed")
        else:  # pragma: no cover
            raise TypeError(f"not an owner event: {ev!r}")

    def _reject(self, ev: object, code: str, message: str) -> None:
        self._out.rejected.append(Rejected(ev, code, message))

    def _submit(self, job: Job) -> None:
        if job.id in self.jobs:
            self._reject(Submitted(job), "conflict", f"job {job.id} was already submitted")
            return
        js = JobState(job, pending_since=job.submit_time)
        self.jobs[job.id] = js
        if Holds.concerns(job):
            held = Holds.needs_hold(job)
            self.holds.submitted(job, held)
            if held:
                return
        self._queue(js)

    def _queue(self, js: JobState) -> None:
        self.pending.add(js)
        self._arrived = True
        if self._queued is not None:
            self._queued.append(js)
        if js.job.request.gpu_milli_total == 0:
            self._arrived_gpu_only = False

    def _cancel(self, js: JobState, now: float, message: str) -> None:
        if js.status is State.PENDING:
            if js.id in self.holds.jobs:  # it leaves the holds as it ends
                self._finish(js, State.CANCELLED, now, "cancelled", f"{message} while held")
                return
            self.pending.remove(js)
            self._finish(js, State.CANCELLED, now, "cancelled", f"{message} while pending")
        elif js.status is State.RUNNING:
            self._stop(js, now, StopReason.CANCEL, message)
        elif self.stop_why[js.id][0] is not StopReason.CANCEL:
            # Stopping to be requeued or moved: it ends as cancelled instead.
            if self.stop_why[js.id][0] is StopReason.PREEMPT:
                if js.id in self.next_start:
                    alloc = self.next_start.pop(js.id)[0]
                    self.state.release(alloc, js.job.request)
                    self._freed = True
                else:
                    self.pending.remove(js)
            self.stop_why[js.id] = (StopReason.CANCEL, False)
            self._note(js, now, "cancel", message, stop_reason=StopReason.CANCEL.value)

    def _exited(self, js: JobState, now: float, code: int | None, detail: str,
                kind: str = "") -> None:
        """The attempt's processes are gone (`code` None: lost, or never launched)."""
        why = self.stop_why.pop(js.id, None)
        if why is not None and why[0] is StopReason.PREEMPT and code == 0:
            # It finished its work as it was asked to stop (the job SDK exits 143 on a stop):
            # done, not to be run again.
            if js in self.pending:
                self.pending.remove(js)
            if self.next_start.get(js.id) is not None:
                self.state.release(self.next_start.pop(js.id)[0], js.job.request)
                self._freed = True
            why = None
        requeue = why is not None and why[0] is StopReason.PREEMPT
        if requeue and js in self.pending:
            self.pending.remove(js)  # its sort key may change with the accounting below
        if js.id in self.runs:  # launched
            self._touch(js, now)
            del self.runs[js.id]
            self.accounted.pop(js.id, None)
            self.held.release(js.allocation, js.job.request)  # type: ignore[arg-type]
        if js.status is State.RUNNING:  # ended on its own: free in the plan too
            self.state.release(js.allocation, js.job.request)  # type: ignore[arg-type]
            del self.running[js.id]
            self.ends.discard(js.id)
            self.deadlines.pop(js.id, None)
            self._freed = True
        js.rate = 0.0  # a finished job keeps its last allocation, to show where it ran
        if requeue:
            self._requeued(js, now, kind or "preempted", detail)
        elif why is not None:
            target = State.CANCELLED if why[0] is StopReason.CANCEL else State.TIMEOUT
            self._finish(js, target, now, target.value, detail, exit_code=code)
        elif kind in ("lost", "launch-retry"):
            self._requeue(js, now, kind, detail)
        elif kind == "launch-failed":
            self._finish(js, State.FAILED, now, kind, detail)
        elif code == 0:
            js.progress = max(js.progress, js.job.duration)
            self._finish(js, State.SUCCEEDED, now, "succeeded", detail, exit_code=0)
        elif js.attempt <= js.job.retries:
            self._requeue(js, now, "retry", f"{detail}; retry {js.attempt} of "
                          f"{js.job.retries}", exit_code=code)
        else:
            self._finish(js, State.FAILED, now, "failed", detail, exit_code=code)

    # --- a pass -------------------------------------------------------------------------------

    def _schedule(self, now: float) -> None:
        queued, self._queued = self._queued, ([] if self.policy.reads_arrivals else None)
        if self._freed or self._pass_due:
            queued = None
        self._freed = self._arrived = self._pass_due = False
        self._arrived_gpu_only = True
        if self.wake_at is not None and now >= self.wake_at:
            self.wake_at = None  # fired
            queued = None
        arrived = None if queued is None else [js for js in queued if js in self.pending]
        d = self._pass(now, arrived)
        if d.preempts and not d.starts:
            self._pass(now)  # preemption only freed resources: plan again at once to use them

    def _pass(self, now: float, arrived: list[JobState] | None = None) -> Decisions:
        if self.policy.reads_running and now != self._touched_at:
            # (A second pass at the same instant finds them current.) Running jobs only: a
            # stopping one may sit in the pending queue, sorted by the service it had when it
            # was stopped.
            account(self.accounted.values(), now)
            self._touched_at = now
        snap = Snapshot(self.cluster, self.state, self.pending, self.running, self.config,
                        self.ends, arrived)
        t0 = time.perf_counter()
        d = self.policy.schedule(snap, now)
        self._out.policy_s += time.perf_counter() - t0
        self.passes += 1
        # The earliest wake-up asked for since the last one fired: a later pass that asks for
        # none (or a later one) does not cancel it.
        if d.wake_at is not None and d.wake_at > now and (self.wake_at is None
                                                          or d.wake_at < self.wake_at):
            self.wake_at = d.wake_at
        self._apply(d, now)
        if self.on_pass is not None:
            self.on_pass(d, now)
        return d

    def _apply(self, d: Decisions, now: float) -> None:
        """The one applier of scheduler decisions. Every stop is planned before any start, so
        a cycle of moves (a swap) applies as well as a chain."""
        running, name = self.running, self.policy.name
        for p in d.preempts:
            js = running.get(p.job_id)
            if js is None or not js.job.preemptible:
                raise AssertionError(f"policy {name}: cannot preempt job {p.job_id} "
                                     f"({'not preemptible' if js else 'not running'})")
            self._stop(js, now, StopReason.PREEMPT, p.reason, checkpoint=p.checkpoint)
        moves = []
        for r in d.resizes:
            js = running.get(r.job_id)
            if js is None:
                raise AssertionError(f"policy {name}: cannot move job {r.job_id}: not running")
            self._stop(js, now, StopReason.PREEMPT, r.reason, checkpoint=True, moved=True)
            moves.append((js, r.allocation, r.reason, r.model))
        for js, alloc, reason, model in moves:
            self._start(js, alloc, reason, model, now)
        jobs = self.jobs
        for s in d.starts:
            js = jobs.get(s.job_id)
            if js is None or js.id in running or js.id in self.next_start or \
                    js.status not in (State.PENDING, State.STOPPING):
                raise AssertionError(f"policy {name}: cannot start job {s.job_id}: "
                                     f"{js.status.value if js else 'unknown'}")
            if self.down.nodes and not self.down.nodes.isdisjoint(s.allocation.nodes):
                self._pass_due = True  # planned on what a victim on a departed node freed
                continue
            self._start(js, s.allocation, s.reason, s.model, now)
        # Hot: a pass may give a reason to hundreds of waiting jobs (backfill examines 500).
        pending = State.PENDING
        for jid, why in d.waiting.items():
            js = jobs.get(jid)
            if js is not None and js.status is pending:
                js.reason = why
            elif self.validate and jid in running:
                raise AssertionError(f"policy {name}: job {jid} both started and waiting")

    # --- transitions --------------------------------------------------------------------------

    def _move(self, js: JobState, new: State, now: float, kind: str, message: str,
              **fields: object) -> None:
        check_transition(js.id, js.status, new)
        self._out.transitions.append(Transition(js.id, js.status, new, now, kind, message,
                                                fields))
        js.status = new
        job, holds = js.job, self.holds
        if job.dependencies or job.array_id is not None or (holds.waiters
                                                            and js.id in holds.waiters):
            holds.moved(job, new)

    def _note(self, js: JobState, now: float, kind: str, message: str, **fields: object) -> None:
        """A change that is not a lifecycle move (the shells store it all the same)."""
        self._out.transitions.append(Transition(js.id, js.status, js.status, now, kind, message,
                                                fields))

    def _start(self, js: JobState, alloc: Allocation, reason: str, model: str | None,
               now: float) -> None:
        """Take `alloc` in the plan. A stopping job restarts on it once it has exited."""
        self.state.allocate(alloc, js.job.request)
        if model is None and alloc.slots and alloc.slots[0].gpus:
            model = self.cluster.nodes[alloc.slots[0].node].gpu_model
        if js.status is State.STOPPING:
            if js in self.pending:  # a preempted job, planned pending (not one being moved)
                self.pending.remove(js)
            self.next_start[js.id] = (alloc, reason, model)
            return
        self.pending.remove(js)
        self._run(js, alloc, reason, model, now)

    def _run(self, js: JobState, alloc: Allocation, reason: str, model: str | None,
             now: float) -> None:
        """PENDING -> RUNNING on `alloc` (already taken in the plan); launched once held."""
        js.attempt += 1
        self._move(js, State.RUNNING, now, "started", f"attempt {js.attempt}: {reason}",
                   start_time=now, attempt=js.attempt, allocation=alloc, stop_reason=None,
                   reason=reason)
        js.allocation, js.model, js.reason = alloc, model, reason
        js.start_time = now
        if js.first_start is None:
            js.first_start = now
        self.running[js.id] = js
        self.ends.add(js)  # its end moves with the clock until it progresses
        self.waiting_launch[js.id] = js

    def _launch_waiting(self, now: float) -> None:
        """Launch, in the order they were decided, the started jobs whose resources are free."""
        if not self.waiting_launch:
            return
        held, out, down = self.held, self._out.instructions, self.down.nodes
        for jid, js in list(self.waiting_launch.items()):
            alloc, req = js.allocation, js.job.request
            if down and not down.isdisjoint(alloc.nodes):  # type: ignore[union-attr]
                # Planned on a victim's GPUs on a node that has left since: back to the queue.
                del self.waiting_launch[jid]
                self._exited(js, now, None, "its node left before its launch", kind="lost")
                self.down.take_free(self.state)
                continue
            if not held.fits(alloc, req):  # type: ignore[arg-type]
                js.reason = WAITING_FOR_RELEASE
                continue
            del self.waiting_launch[jid]
            held.allocate(alloc, req)  # type: ignore[arg-type]
            if js.reason is WAITING_FOR_RELEASE:
                js.reason = "launched once stopping jobs had released its resources"
                self._note(js, now, "launched", js.reason)
            js.start_time = now  # the run is charged from its launch
            self.runs[jid] = Run(now, now, 0.0, 0.0, js.progress, js.attained, js.executed,
                                  req.num_gpus)
            self.accounted[jid] = (js, self.runs[jid], js.job.duration)
            if js.job.time_limit:
                self.deadlines[jid] = now + js.job.time_limit
            out.append(Launch(jid, js.attempt, alloc, js.reason, js.model))  # type: ignore[arg-type]

    def _stop(self, js: JobState, now: float, reason: StopReason, message: str, *,
              checkpoint: bool = False, moved: bool = False) -> None:
        """Ask a running job to stop. Its resources are free in the plan at once."""
        self._touch(js, now)
        self.state.release(js.allocation, js.job.request)  # type: ignore[arg-type]
        del self.running[js.id]
        self.accounted.pop(js.id, None)
        self.ends.discard(js.id)
        self.deadlines.pop(js.id, None)
        if reason is not StopReason.PREEMPT:  # a pass's own preemptions are in its plan
            self._freed = True
        self._move(js, State.STOPPING, now, "move" if moved else f"stop-{reason.value}",
                   message, stop_reason=reason.value)
        self.stop_why[js.id] = (reason, checkpoint)
        if reason is StopReason.PREEMPT and not moved:
            js.preemptions += 1
            js.last_preempted = js.pending_since = now
            self.preemptions += 1
            self.pending.add(js)  # planned as pending again from now on
        if self.waiting_launch.pop(js.id, None) is not None:  # never launched: nothing to stop
            self._exited(js, now, None, "stopped before its launch")
            return
        self._out.instructions.append(Stop(js.id, js.attempt, reason, message, checkpoint))

    def _requeued(self, js: JobState, now: float, kind: str, message: str) -> None:
        """A preempted or moved job has exited: it restarts where the plan put it, or queues."""
        self._rewind(js)
        self._move(js, State.PENDING, now, kind, message, allocation=None, stop_reason=None,
                   preemptions=js.preemptions, reason=f"requeued ({kind})")
        js.start_time = js.allocation = None
        restart = self.next_start.pop(js.id, None)
        if restart is None:
            self.pending.add(js)  # it was planned pending; only its sort key moved
        else:
            self._run(js, *restart, now)

    def _requeue(self, js: JobState, now: float, kind: str, message: str, **fields: object
                 ) -> None:
        """A running job ended on its own and goes back to the queue (lost, retry)."""
        self._rewind(js)
        why = f"requeued after {kind}: {message}"
        self._move(js, State.PENDING, now, kind, message, allocation=None, stop_reason=None,
                   reason=why, **fields)
        js.pending_since, js.start_time, js.allocation = now, None, None
        js.reason = why
        self._queue(js)

    def _rewind(self, js: JobState) -> None:
        """It will resume from its last checkpoint: the work since then is lost (none, when it
        saved as it was asked to stop)."""
        self.lost_work += max(0.0, js.progress - js.checkpointed)
        js.progress = js.checkpointed

    def _finish(self, js: JobState, state: State, now: float, kind: str, message: str,
                **fields: object) -> None:
        self._move(js, state, now, kind, message, end_time=now, reason=message, **fields)
        js.end_time, js.reason = now, message
        if not self.keep_finished:
            self._gone.append(js.id)  # at the end of the step: held jobs may ask about it

    # --- held jobs ----------------------------------------------------------------------------

    def _release_held(self, now: float) -> None:
        """Held jobs whose dependencies are met and whose array has a slot join the queue;
        those whose dependencies never can be met are cancelled (Slurm's
        kill_invalid_depend)."""
        go, never = self.holds.release(self._state_of)
        self._out.held_examined += self.holds.examined
        for job in go:
            self._queue(self.jobs[job.id])
        for job_id, why in never:
            self._finish(self.jobs[job_id], State.CANCELLED, now, "cancelled", why)

    def _state_of(self, job_id: int) -> tuple[State, bool] | None:
        """(state, has started) of a job a held one waits on: an array of the owner's by its
        tasks, a job of the owner's, else what the shell's record says."""
        tally = self.holds.tallies.get(job_id)
        if tally is not None:
            return tally.state()
        js = self.jobs.get(job_id)
        if js is not None and js.job.array_id != job_id:
            return js.status, js.attempt > 0
        return None if self.lookup is None else self.lookup(job_id)

    def _end_step(self, now: float) -> None:
        """Forget the jobs that finished in this step (unless it keeps them), and say when
        held jobs want another look."""
        if self._gone:
            for jid in self._gone:
                del self.jobs[jid]
            self._gone.clear()
            self.holds.drop_ended_arrays()
        self._held_due = now if self.holds.dirty else None

    # --- accounting ---------------------------------------------------------------------------

    def _touch(self, js: JobState, now: float) -> None:
        run = self.runs.get(js.id)
        if run is not None:  # launched
            account(((js, run, js.job.duration),), now)

    # --- invariants ---------------------------------------------------------------------------

    def check(self) -> None:
        """The invariants, for tests and the simulator's validate mode."""
        check_owner(self)

"""The simulated runtime: jobs "run" in virtual time at the throughput model's speed.

It is what the simulator (and the control plane's tests in virtual time) put where the platform
has processes. It implements the runtime protocol (`plinth.core.runtime.Runtime`) as the local
and Ray runtimes do, on a clock it is given (`clock`, read at each call), and reports what real
processes would. By default (the model every simulation uses):

- `launch`: a STARTED event (the "progress" capability). The attempt resumes from what the job
  last saved, after the restore overhead if it ran before, at the `WorkModel`'s speed for the
  job on its allocation (`SchedConfig.work_model`: the throughput model times the gang's
  locality). It also declares the job's checkpoint cadence (`checkpoint_interval` units of
  work), so that periodic checkpoints need no event each.
- `stop`: the job honours SIGTERM at once and exits with 143. With `checkpoint` (a lease
  ending, a move) it saves first and reports CHECKPOINTED; otherwise it keeps only its last
  periodic checkpoint. A cadence of 0 models perfect checkpointing: every stop saves. A grace of
  0 is a SIGKILL, as on the platform: 137 at once, and nothing saved.
- Its finish: EXITED 0 when the work is done.

What a launch, a stop or an adoption causes at once comes out of the next `poll`, in the order
the calls were made; then the ends and saves due by the clock, in time order (ties in launch
order, a job's saves before its end). `next_time()` says when the next of those is due, so that
a virtual clock can jump there.

A job can also act out what a real one does (`SimBehaviour`, given per job and attempt by
`behaviour`; see plinth.runtime.sim_behaviour): exit with a code of its own, at a time of its
own; ignore SIGTERM, so that a stop ends it only when the SIGKILL comes `grace_s` later (137);
vanish (LOST); save at given times with step numbers (CHECKPOINTED, in order, before the end).
The workers of a gang may act differently, and the attempt ends as the local runtime ends one
(`gang_end`).

A restart in virtual time: `restart()` closes this runtime and returns a new one over the same
simulated processes, which run on while no runtime watches. The new one watches an attempt once
it `adopt`s it (or finds it: `find`); an attempt that ended while it was down reports its end
then, after its latest save (reported again, as the local runtime's checkpoint marker is: at
least once).

`worker_env` gives the environment an attempt's workers would have had (`gang_env`, the one
every runtime uses).

A job's true `duration` is known only here: policies see estimates, as on the platform.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from plinth.core.errors import PlinthError
from plinth.core.progress import WorkModel, periodic_checkpoint
from plinth.core.resources import Allocation, Cluster, Node, WorkerSlot
from plinth.core.runtime import EventKind, Handle, LaunchSpec, RuntimeEvent, gang_env
from plinth.core.workload import Job
from plinth.runtime.sim_behaviour import (
    KILLED_EXIT_CODE,
    STOPPED_EXIT_CODE,
    Behaviour,
    SimBehaviour,
    gang_end,
)

DEFAULT_GANG_GRACE_S = 10.0  # the control plane's default grace (plinth.control.server)
MASTER_PORT_BASE = 29500  # torch.distributed's usual port; each launch takes the next one
MASTER_PORTS = 30000  # ... within this many, so that the port stays below 65536
_CACHE = 65536  # allocations remembered (see `_allocation`)

_STARTED, _EXITED, _LOST = EventKind.STARTED, EventKind.EXITED, EventKind.LOST
_CHECKPOINTED = EventKind.CHECKPOINTED


@dataclass(slots=True)
class _Script:
    """A behaving attempt: what each worker does, the stops it got, and the resulting plan."""

    ranks: tuple[SimBehaviour, ...]
    explicit: bool  # saves are listed (reported as events), not the configured cadence
    stops: list[tuple[float, float, bool]] = field(default_factory=list)  # (at, grace, save?)
    saves: list[tuple[float, int | None]] = field(default_factory=list)  # (at, step) planned
    exit_code: int | None = 0  # at the end; None: lost
    message: str = ""
    reported: int = 0  # saves delivered by the runtime watching it


@dataclass(slots=True)
class _Proc:
    attempt: int
    t0: float  # progress begins (after the restore)
    rate: float
    base: float  # progress it resumed from
    seq: int  # launch order: ties at one time break by it
    launched: float
    finish: float  # when its work is done
    end: float  # when it ends: at its finish, unless it behaves otherwise or is stopped
    spec: LaunchSpec
    script: _Script | None = None  # None: the default model


class SimRuntime:
    capabilities = frozenset({"checkpoint", "relaunch", "progress"})

    def __init__(self, cluster: Cluster, work: WorkModel, jobs: Mapping[int, Job], *,
                 clock: Callable[[], float], behaviour: Behaviour | None = None,
                 gang_grace_s: float = DEFAULT_GANG_GRACE_S) -> None:
        """`jobs`: each job by id, read at its launch (its duration and type); `clock`: the
        virtual time, read at each call."""
        if not gang_grace_s >= 0:
            raise ValueError(f"SimRuntime: gang_grace_s must be >= 0 seconds, got "
                             f"{gang_grace_s!r}")
        self.cluster, self.work, self.jobs, self.clock = cluster, work, jobs, clock
        self.behaviour, self.gang_grace_s = behaviour, gang_grace_s
        self.saved: dict[int, float] = {}  # job -> progress its last checkpoint holds
        self.ran: set[int] = set()  # jobs stopped before: a restart pays the restore
        self.procs: dict[int, _Proc] = {}  # the attempts this runtime watches
        self.closed = False
        self._unadopted: dict[int, _Proc] = {}  # running, left by a runtime before a restart
        self._heap: list[tuple[float, int, int, int]] = []  # (time, seq, job, attempt)
        self._ready: list[RuntimeEvent] = []  # caused by a call: out with the next poll
        self._seq = 0
        # A replay launches on the same few allocations again and again: worked out once.
        self._allocations: dict[tuple, tuple[Allocation, str | None]] = {}

    # --- the runtime protocol -----------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return list(self.cluster.nodes)

    def launch(self, spec: LaunchSpec) -> Handle:
        self._check_open()
        now, jid, work = self.clock(), spec.job_id, self.work
        job = self.jobs[jid]
        alloc, model = self._allocation(spec)
        rate = work.speed(job, alloc, model)
        t0 = now + (work.restore_overhead if jid in self.ran else 0.0)
        base = self.saved.get(jid, 0.0)
        self._seq += 1
        finish = t0 + max(0.0, job.duration - base) / rate
        p = _Proc(spec.attempt, t0, rate, base, self._seq, now, finish, finish, spec)
        self.procs[jid] = p
        b = None if self.behaviour is None else self.behaviour(job, spec.attempt)
        every = work.checkpoint_interval
        if b is None:
            heapq.heappush(self._heap, (finish, self._seq, jid, spec.attempt))
        else:
            ranks = tuple(b.for_rank(r) for r in range(max(1, len(spec.workers))))
            p.script = _Script(ranks, any(r.checkpoints is not None for r in ranks))
            self._plan(p)
            self._watch(jid, p)
            if p.script.explicit:
                every = 0.0
        self._ready.append(RuntimeEvent(jid, spec.attempt, _STARTED, at=t0, rate=rate,
                                        checkpoint_every=every))
        return Handle(jid, spec.attempt, (), spec.checkpoint_dir)

    def stop(self, job_id: int, attempt: int, grace_s: float, *, checkpoint: bool = False
             ) -> None:
        self._check_open()
        if not grace_s >= 0:
            raise ValueError(f"SimRuntime.stop: grace_s must be >= 0 seconds, got {grace_s!r}")
        p = self.procs.get(job_id)
        if p is None or p.attempt != attempt:
            return  # it has ended already, or never ran here
        now, out = self.clock(), self._ready
        if p.script is not None:
            p.script.stops.append((now, grace_s, checkpoint))
            self._plan(p)
            if not self._deliver(job_id, p, now, out):
                self._watch(job_id, p)  # it ends later: killed when the grace runs out
            return
        del self.procs[job_id]
        every = self.work.checkpoint_interval
        progress = self._progress(job_id, p, now)
        self.ran.add(job_id)
        if grace_s <= 0:  # SIGKILL: no time to save
            if every > 0:
                self.saved[job_id] = periodic_checkpoint(progress, self.saved.get(job_id, 0.0),
                                                         every)
            out.append(RuntimeEvent(job_id, attempt, _EXITED, KILLED_EXIT_CODE))
            return
        if checkpoint or every <= 0:
            self.saved[job_id] = progress
            out.append(_saved(job_id, attempt, now))
        else:
            self.saved[job_id] = periodic_checkpoint(progress, self.saved.get(job_id, 0.0),
                                                     every)
        out.append(RuntimeEvent(job_id, attempt, _EXITED, STOPPED_EXIT_CODE))

    def poll(self) -> list[RuntimeEvent]:
        """What the calls since the last poll caused, then the events due by the clock."""
        out, self._ready = self._ready, []
        if self.closed:
            return out  # what it queued before it went down
        now = self.clock()
        heap, procs = self._heap, self.procs
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            t, _, jid, attempt = entry
            p = procs.get(jid)
            if p is None or p.attempt != attempt:
                continue
            if p.script is None:
                del procs[jid]
                out.append(RuntimeEvent(jid, attempt, _EXITED, 0))
            elif self._due(entry) and not self._deliver(jid, p, t, out):
                self._watch(jid, p)
        return out

    def adopt(self, handle: Handle) -> bool:
        """Take over an attempt launched before a restart: True while it runs, now watched
        (its latest save, if it made one, is reported again); False if it ended while no
        runtime watched (its latest save and its end are reported, the end with when it came).
        Saves made while down before the latest are not reported (the local runtime's marker
        holds only the latest). An attempt not running here is lost."""
        self._check_open()
        job_id, attempt, now = handle.job_id, handle.attempt, self.clock()
        mine = self.procs.get(job_id)
        if mine is not None and mine.attempt == attempt:
            return True
        p = self._unadopted.get(job_id)
        if p is None or p.attempt != attempt:
            self._ready.append(RuntimeEvent(job_id, attempt, _LOST,
                                            message="not running here and no exit code left"))
            return False
        del self._unadopted[job_id]
        self.procs[job_id] = p
        sc = p.script
        if sc is not None:
            made = sum(1 for at, _ in sc.saves if at <= now)
            if made:
                at, step = sc.saves[made - 1]
                self._ready.append(_saved(job_id, attempt, at, step))
            sc.reported = made
        if p.end <= now:
            del self.procs[job_id]
            end = self._ended(job_id, p)
            if end.kind is _EXITED:  # it ended while no runtime watched: say when
                end = RuntimeEvent(job_id, attempt, _EXITED, end.exit_code, end.message,
                                   at=p.end)
            self._ready.append(end)
            return False
        self._watch(job_id, p)
        return True

    def find(self, job_id: int, attempt: int, workers: int) -> Handle | None:
        """The handle of an attempt launched before a restart and still running here (the
        simulated processes record their own launches); None if there is none."""
        p = self._unadopted.get(job_id) or self.procs.get(job_id)
        if p is None or p.attempt != attempt:
            return None
        return Handle(job_id, attempt, (), p.spec.checkpoint_dir)

    def close(self) -> None:
        """Stop watching: the simulated processes run on, for the next runtime (`restart`)."""
        self.closed = True

    def next_time(self) -> float | None:
        """When the next event is due: at once if a call has caused one, else the next end or
        save of a watched attempt (None: nothing will happen unless asked)."""
        if self._ready:
            return self.clock()
        heap = self._heap
        while heap and not self._due(heap[0]):
            heapq.heappop(heap)  # an attempt stopped or rescheduled since
        return heap[0][0] if heap else None

    # --- restarts -----------------------------------------------------------------------------

    def restart(self) -> SimRuntime:
        """This runtime goes down (closed, if it was not: using it raises); the one returned
        is the next runtime, as a restarted control plane builds it. The simulated processes
        and their saves carry over and run on; it watches none of them until it adopts them."""
        self.closed = True
        new = SimRuntime(self.cluster, self.work, self.jobs, clock=self.clock,
                         behaviour=self.behaviour, gang_grace_s=self.gang_grace_s)
        new.saved, new.ran, new._seq = self.saved, self.ran, self._seq
        new._allocations = self._allocations
        new._unadopted = {**self._unadopted, **self.procs}
        return new

    # --- what a launch set up -----------------------------------------------------------------

    def worker_env(self, job_id: int, attempt: int) -> dict[int, dict[str, str]]:
        """The gang environment each worker of a running attempt would have got, by rank. The
        rendezvous is on rank 0's node, at a port of its own per launch."""
        p = self._running(job_id, attempt)
        spec = p.spec
        rank0 = min(spec.workers, key=lambda w: w.rank)
        return gang_env(spec, master_addr=rank0.node,
                        master_port=MASTER_PORT_BASE + p.seq % MASTER_PORTS)

    def _allocation(self, spec: LaunchSpec) -> tuple[Allocation, str | None]:
        """The allocation a LaunchSpec's workers stand for (GPUs numbered across the cluster),
        and the GPU model of its first worker's node (None without GPUs)."""
        found = self._allocations.get(spec.workers)
        if found is None:
            if len(self._allocations) >= _CACHE:
                self._allocations.clear()
            found = self._allocations[spec.workers] = self._allocation_of(spec)
        return found

    def _allocation_of(self, spec: LaunchSpec) -> tuple[Allocation, str | None]:
        cluster, slots = self.cluster, []
        for w in sorted(spec.workers, key=lambda w: w.rank):
            i = cluster.node_index.get(w.node)
            if i is None:
                raise PlinthError(f"job {spec.job_id}: worker {w.rank} is placed on node "
                                  f"{w.node!r}, which the simulated cluster does not have")
            first = cluster.node_gpu_range[i][0]
            slots.append(WorkerSlot(i, tuple(first + g for g in w.gpus), w.gpu_milli,
                                    w.gpu_memory_mib))
        model = cluster.nodes[slots[0].node].gpu_model if slots and slots[0].gpus else None
        return Allocation(tuple(slots)), model

    # --- behaving attempts --------------------------------------------------------------------

    def _plan(self, p: _Proc) -> None:
        """Work out when a behaving attempt saves and ends, given the stops it got so far. The
        saves before the latest stop are the same as before it, so those reported stay valid."""
        sc = p.script
        assert sc is not None
        ends: list[tuple[float, int | None]] = []
        for b in sc.ranks:
            own = p.finish if b.exit_at is None else p.launched + b.exit_at
            gone = math.inf if b.vanish_at is None else p.launched + b.vanish_at
            ends.append((gone, None) if gone <= own else (own, b.exit_code))
        g = gang_end(ends, [b.ignore_term for b in sc.ranks], [s[:2] for s in sc.stops],
                     gang_grace_s=self.gang_grace_s)
        saves: set[tuple[float, int | None]] = set()
        for b, until in zip(sc.ranks, g.worker_end, strict=True):
            saves.update((p.launched + t, step) for t, step in b.checkpoints or ()
                         if p.launched + t <= until)
        every = self.work.checkpoint_interval
        for (at, _, save), honoured in zip(sc.stops, g.honoured, strict=True):
            if honoured and (save or (not sc.explicit and every <= 0)):
                saves.add((at, None))  # asked to save as it stops (or perfect checkpointing)
        sc.saves = sorted(saves, key=lambda s: (s[0], s[1] is None, s[1] or 0))
        sc.exit_code, sc.message = g.exit_code, g.message
        p.end = g.at

    def _watch(self, jid: int, p: _Proc) -> None:
        """Queue a behaving attempt's next event (none if only a stop can end it)."""
        t = self._next_of(p)
        if not math.isinf(t):
            heapq.heappush(self._heap, (t, p.seq, jid, p.attempt))

    def _deliver(self, jid: int, p: _Proc, now: float, out: list[RuntimeEvent]) -> bool:
        """Append a behaving attempt's saves due by `now`, then its end if due; True if it
        ended."""
        sc = p.script
        assert sc is not None
        while sc.reported < len(sc.saves) and sc.saves[sc.reported][0] <= now:
            at, step = sc.saves[sc.reported]
            sc.reported += 1
            out.append(_saved(jid, p.attempt, at, step))
        if p.end > now:
            return False
        del self.procs[jid]
        out.append(self._ended(jid, p))
        return True

    def _ended(self, jid: int, p: _Proc) -> RuntimeEvent:
        """A behaving attempt's end event; what it saved is what its next attempt resumes
        from (the periodic cadence, unless it lists its saves: as the owner counts it)."""
        sc = p.script
        if sc is None:  # the default model, adopted after a restart: its work is done
            return RuntimeEvent(jid, p.attempt, _EXITED, 0)
        saved = self.saved.get(jid, 0.0)
        if sc.saves:
            saved = self._progress(jid, p, sc.saves[-1][0])
        every = self.work.checkpoint_interval
        if not sc.explicit and every > 0:
            saved = periodic_checkpoint(self._progress(jid, p, p.end), saved, every)
        self.saved[jid] = saved
        self.ran.add(jid)
        if sc.exit_code is None:
            return RuntimeEvent(jid, p.attempt, _LOST, message=sc.message)
        return RuntimeEvent(jid, p.attempt, _EXITED, sc.exit_code, sc.message)

    # --- helpers ------------------------------------------------------------------------------

    def _progress(self, jid: int, p: _Proc, t: float) -> float:
        ran = t - p.t0
        return min(p.base + p.rate * ran if ran > 0 else p.base, self.jobs[jid].duration)

    @staticmethod
    def _next_of(p: _Proc) -> float:
        sc = p.script
        if sc is not None and sc.reported < len(sc.saves):
            return sc.saves[sc.reported][0]
        return p.end

    def _due(self, entry: tuple[float, int, int, int]) -> bool:
        """Whether a queued entry is still its attempt's next event."""
        t, _, jid, attempt = entry
        p = self.procs.get(jid)
        if p is None or p.attempt != attempt:
            return False
        return p.script is None or self._next_of(p) == t

    def _running(self, job_id: int, attempt: int) -> _Proc:
        p = self.procs.get(job_id) or self._unadopted.get(job_id)
        if p is None or p.attempt != attempt:
            raise LookupError(f"job {job_id} attempt {attempt} is not running here")
        return p

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this simulated runtime was closed (restarted): use the one "
                               "restart() returned")


def _saved(job_id: int, attempt: int, at: float, step: int | None = None) -> RuntimeEvent:
    """A save (`step` None: one made as the job was stopped, which names no step)."""
    what = "checkpoint as it stopped" if step is None else f"checkpoint at step {step}"
    return RuntimeEvent(job_id, attempt, _CHECKPOINTED, message=what, step=step, at=at)

"""The simulated runtime: jobs "run" in virtual time at the throughput model's speed.

It is what the simulator puts where the platform has processes. It carries out the owner's
instructions and reports what real processes would. By default (the model every simulation
uses):

- `Launch`: a `Started` event. The attempt resumes from what the job last saved, after the
  restore overhead if it ran before, at `rate = config.throughputs.speed(job type, GPU model) x
  locality` (no locality factor for fixed-speed jobs: their durations were observed). It also
  declares the job's checkpoint cadence (`SchedConfig.checkpoint_interval` units of work), so
  periodic checkpoints need no event each.
- `Stop`: the job honours SIGTERM at once and exits with 143. With `checkpoint` (a lease
  ending, a move) it saves first and reports `CheckpointSaved`; otherwise it keeps only its last
  periodic checkpoint. A cadence of 0 models perfect checkpointing: every stop saves. A grace of
  0 is a SIGKILL, as on the platform: 137 at once, and nothing saved.
- Its finish: `Exited(0)` when the work is done, from `advance(now)`.

A job can also act out what a real one does (`SimBehaviour`, given per job and attempt by
`behaviour`): exit with a code of its own, at a time of its own; ignore SIGTERM, so that a stop
ends it only when the SIGKILL comes `grace_s` later (137); vanish (`Lost`); save at given times
with step numbers (`CheckpointSaved`, in order, before the end). The workers of a gang may act
differently, and the attempt ends as the local runtime ends one (`gang_end`): the first non-zero
code in the order the workers ended, `Lost` if one vanished, and the others stopped (with
`gang_grace_s`) as soon as one fails. Ends and saves that lie in the future come out of
`advance(now)` in time order (ties in launch order, a job's saves before its end), and
`next_time()` includes them.

A restart in virtual time: `restart()` closes this runtime and returns a new one over the same
simulated processes, which run on while no runtime watches. The new one watches an attempt once
it `adopt`s it; an attempt that ended while it was down reports its end then, after its latest
save (reported again, as the local runtime's checkpoint marker is: at least once).

`worker_env` gives the environment an attempt's workers would have had (`gang_env`, the one
every runtime uses, on the workers `worker_launches` derives from the allocation).

A job's true `duration` is known only here: policies see estimates, as on the platform.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from plinth.core.resources import Allocation, Cluster
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.runtime.base import LaunchSpec, gang_env, worker_launches
from plinth.sched.owner import (
    CheckpointSaved,
    Event,
    Exited,
    Instruction,
    Launch,
    Lost,
    Started,
    Stop,
    periodic_checkpoint,
)
from plinth.sched.placement import locality_factor
from plinth.sched.types import SchedConfig

STOPPED_EXIT_CODE = 143  # what a job that honours SIGTERM exits with (128 + 15)
KILLED_EXIT_CODE = 137  # what the SIGKILL at the end of the grace leaves (128 + 9)
DEFAULT_GRACE_S = 10.0  # the control plane's default (plinth.control.server)
MASTER_PORT_BASE = 29500  # torch.distributed's usual port; each launch takes the next one
MASTER_PORTS = 30000  # ... within this many, so that the port stays below 65536


@dataclass(frozen=True, slots=True)
class SimBehaviour:
    """What a simulated attempt acts out besides its work. Times are seconds after its launch.

    `exit_code` is the code it exits with when it ends on its own, at `exit_at` (None: when its
    work is done). At `vanish_at` it vanishes instead, unless it ended before: the attempt is
    lost. With `ignore_term` a stop's SIGTERM does nothing: it runs on (and saves) until the
    SIGKILL at the end of the grace, or until its own end if that comes first. `checkpoints`
    are its saves, (seconds, step) in time order, each reported as `CheckpointSaved` (and the
    cadence declared in `Started` is then 0); None keeps the default model, the configured
    cadence. `ranks` says what some workers of a gang do instead (without `ranks` of their own).
    """

    exit_code: int = 0
    exit_at: float | None = None
    vanish_at: float | None = None
    ignore_term: bool = False
    checkpoints: tuple[tuple[float, int], ...] | None = None
    ranks: Mapping[int, SimBehaviour] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("exit_at", "vanish_at"):
            v = getattr(self, name)
            if v is not None and not v >= 0:  # NaN is refused too
                raise ValueError(f"SimBehaviour.{name}: must be >= 0 seconds, got {v!r}")
        if self.checkpoints is not None:
            times = [t for t, _ in self.checkpoints]
            if not all(t >= 0 for t in times) or times != sorted(times) or \
                    any(step < 0 for _, step in self.checkpoints):
                raise ValueError("SimBehaviour.checkpoints: (seconds >= 0, step >= 0) in time "
                                 f"order, got {self.checkpoints!r}")
        for rank, b in self.ranks.items():
            if rank < 0 or b.ranks:
                raise ValueError(f"SimBehaviour.ranks[{rank}]: a rank >= 0 whose behaviour has "
                                 f"no ranks of its own, got {b!r}")

    def for_rank(self, rank: int) -> SimBehaviour:
        return self.ranks.get(rank, self)


# Per job and attempt: what it acts out (None: the default model).
Behaviour = Callable[[Job, int], SimBehaviour | None]


@dataclass(frozen=True, slots=True)
class GangEnd:
    """How a gang's attempt ends (`gang_end`)."""

    at: float  # when the last worker ended (inf: only a stop could end it)
    exit_code: int | None  # None: lost
    message: str
    worker_end: tuple[float, ...]  # when each worker ended, by rank
    honoured: tuple[bool, ...]  # per stop: some worker ended on its SIGTERM


def gang_end(ends: Sequence[tuple[float, int | None]], ignore_term: Sequence[bool],
             stops: Sequence[tuple[float, float]], *, gang_grace_s: float) -> GangEnd:
    """How an attempt ends, as the local runtime ends one. `ends[r]` is when worker r ends on its
    own and with what code (None: it vanishes); `stops` are the stops asked for, (time, grace)
    in time order. A worker that fails (a non-zero code, or vanished) has the others stopped
    with `gang_grace_s`. A stop's SIGTERM ends at once every worker that honours it (143), the
    SIGKILL `grace` later the others (137); a grace of 0 is the SIGKILL at once. At one instant,
    workers ending on their own come first, then a stop, then a kill."""
    n = len(ends)
    alive = set(range(n))
    by_end = sorted(range(n), key=lambda r: (ends[r][0], r))
    worker_end = [math.inf] * n
    ended: list[tuple[int, int | None]] = []  # (rank, code) in the order they ended
    honoured = [False] * len(stops)
    kill_at, reason, i, si = math.inf, "", 0, 0

    def finish(rank: int, t: float, code: int | None) -> None:
        alive.discard(rank)
        worker_end[rank] = t
        ended.append((rank, code))

    def term(t: float, grace: float) -> bool:
        nonlocal kill_at
        hit = False
        for r in sorted(alive):
            if grace <= 0:
                finish(r, t, KILLED_EXIT_CODE)
            elif not ignore_term[r]:
                finish(r, t, STOPPED_EXIT_CODE)
                hit = True
        if grace > 0:
            kill_at = min(kill_at, t + grace)
        return hit

    while alive:
        while by_end[i] not in alive:
            i += 1
        t_own = ends[by_end[i]][0]
        t_stop = stops[si][0] if si < len(stops) else math.inf
        t = min(t_own, t_stop, kill_at)
        if math.isinf(t):
            break
        if t_own == t:
            rank, code = by_end[i], ends[by_end[i]][1]
            finish(rank, t, code)
            if code != 0 and alive and not reason:
                what = "vanished" if code is None else f"exited with {code}"
                reason = f"rank {rank} {what}; the other workers were stopped"
                term(t, gang_grace_s)
        elif t_stop == t:
            grace = stops[si][1]
            reason = reason or f"stopped (SIGTERM, SIGKILL after {grace:g}s)"
            honoured[si] = term(t, grace)
            si += 1
        else:
            for r in sorted(alive):
                finish(r, t, KILLED_EXIT_CODE)
    lost = next((r for r, code in ended if code is None), None)
    code = None if lost is not None else next((c for _, c in ended if c), 0)
    message = f"rank {lost} vanished" if lost is not None else reason
    return GangEnd(math.inf if alive else max(worker_end), code, message, tuple(worker_end),
                   tuple(honoured))


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
    allocation: Allocation
    script: _Script | None = None  # None: the default model


class SimRuntime:
    capabilities = frozenset({"checkpoint", "relaunch"})

    def __init__(self, cluster: Cluster, config: SchedConfig, jobs: Mapping[int, Job], *,
                 behaviour: Behaviour | None = None, grace_s: float = DEFAULT_GRACE_S,
                 gang_grace_s: float = DEFAULT_GRACE_S,
                 checkpoint_root: str = "/sim/checkpoints") -> None:
        for name, v in (("grace_s", grace_s), ("gang_grace_s", gang_grace_s)):
            if not v >= 0:
                raise ValueError(f"SimRuntime: {name} must be >= 0 seconds, got {v!r}")
        self.cluster, self.config, self.jobs = cluster, config, jobs
        self.behaviour, self.grace_s, self.gang_grace_s = behaviour, grace_s, gang_grace_s
        self.checkpoint_root = checkpoint_root
        self.saved: dict[int, float] = {}  # job -> progress its last checkpoint holds
        self.ran: set[int] = set()  # jobs stopped before: a restart pays the restore
        self.procs: dict[int, _Proc] = {}  # the attempts this runtime watches
        self.closed = False
        self._unadopted: dict[int, _Proc] = {}  # running, left by a runtime before a restart
        self._heap: list[tuple[float, int, int, int]] = []  # (time, seq, job, attempt)
        self._seq = 0

    # --- the shell's calls --------------------------------------------------------------------

    def next_time(self) -> float | None:
        """When the next event of a watched attempt is due (an end or a save)."""
        heap = self._heap
        while heap and not self._due(heap[0]):
            heapq.heappop(heap)  # an attempt stopped or rescheduled since
        return heap[0][0] if heap else None

    def advance(self, now: float) -> list[Event]:
        """The events due by `now`, in time order (ties in launch order, saves before ends)."""
        self._check_open()
        out: list[Event] = []
        heap, procs = self._heap, self.procs
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            t, _, jid, attempt = entry
            p = procs.get(jid)
            if p is None or p.attempt != attempt:
                continue
            if p.script is None:
                del procs[jid]
                out.append(Exited(jid, attempt, 0))
            elif self._due(entry) and not self._deliver(jid, p, t, out):
                self._watch(jid, p)
        return out

    def execute(self, instructions: Iterable[Instruction], now: float, *,
                grace_s: float | None = None) -> list[Event]:
        """Carry out `instructions` at `now`; a Stop's grace is `grace_s` (else the runtime's)."""
        self._check_open()
        grace = self.grace_s if grace_s is None else grace_s
        if not grace >= 0:
            raise ValueError(f"SimRuntime.execute: grace_s must be >= 0 seconds, got {grace!r}")
        out: list[Event] = []
        for ins in instructions:
            if type(ins) is Launch:
                out.append(self._launch(ins, now))
            else:
                out.extend(self._stop(ins, now, grace))  # type: ignore[arg-type]
        return out

    # --- restarts -----------------------------------------------------------------------------

    def restart(self) -> SimRuntime:
        """This runtime goes down (it is closed: using it raises); the one returned is the next
        runtime, as a restarted control plane builds it. The simulated processes and their saves
        carry over and run on; it watches none of them until it adopts them."""
        self._check_open()
        self.closed = True
        new = SimRuntime(self.cluster, self.config, self.jobs, behaviour=self.behaviour,
                         grace_s=self.grace_s, gang_grace_s=self.gang_grace_s,
                         checkpoint_root=self.checkpoint_root)
        new.saved, new.ran, new._seq = self.saved, self.ran, self._seq
        new._unadopted = {**self._unadopted, **self.procs}
        return new

    def adopt(self, job_id: int, attempt: int, now: float) -> tuple[bool, list[Event]]:
        """Take over an attempt launched before a restart: (True, its latest save again, if it
        made one) while it runs, now watched; (False, [latest save, its end]) if it ended while
        no runtime watched. Saves made while down before the latest are not reported (the
        local runtime's marker holds only the latest). An attempt not running here is lost."""
        self._check_open()
        mine = self.procs.get(job_id)
        if mine is not None and mine.attempt == attempt:
            return True, []
        p = self._unadopted.get(job_id)
        if p is None or p.attempt != attempt:
            return False, [Lost(job_id, attempt, "not running here and no exit code left")]
        del self._unadopted[job_id]
        self.procs[job_id] = p
        out: list[Event] = []
        sc = p.script
        if sc is not None:
            made = sum(1 for at, _ in sc.saves if at <= now)
            if made:
                at, step = sc.saves[made - 1]
                out.append(CheckpointSaved(job_id, attempt, at, step))
            sc.reported = made
        if p.end <= now:
            del self.procs[job_id]
            out.append(self._ended(job_id, p))
            return False, out
        self._watch(job_id, p)
        return True, out

    # --- what a launch would have set up ------------------------------------------------------

    def checkpoint_dir(self, job_id: int) -> str:
        return os.path.join(self.checkpoint_root, str(job_id))

    def launch_spec(self, job_id: int, attempt: int) -> LaunchSpec:
        """The LaunchSpec a running attempt would have had: its workers and checkpoint
        directory (no command is run, no log written)."""
        p = self._running(job_id, attempt)
        return LaunchSpec(job_id, attempt, (), worker_launches(
            self.cluster, p.allocation, self.jobs[job_id].request), log_path="",
            checkpoint_dir=self.checkpoint_dir(job_id))

    def worker_env(self, job_id: int, attempt: int) -> dict[int, dict[str, str]]:
        """The gang environment each worker of a running attempt would have got, by rank. The
        rendezvous is on rank 0's node, at a port of its own per launch."""
        spec, p = self.launch_spec(job_id, attempt), self._running(job_id, attempt)
        return gang_env(spec, master_addr=spec.workers[0].node,
                        master_port=MASTER_PORT_BASE + p.seq % MASTER_PORTS)

    # --- launching and stopping ---------------------------------------------------------------

    def _launch(self, ins: Launch, now: float) -> Event:
        job, cfg = self.jobs[ins.job_id], self.config
        thr = cfg.throughputs
        jtype = thr.type_of(job)
        # A fixed-speed job's duration was observed as it ran (a pod's lifetime, a platform
        # export), so it already holds the cost of where it ran.
        rate = thr.speed(jtype, ins.model) * (1.0 if jtype == FIXED_SPEED else
                                             locality_factor(self.cluster, ins.allocation,
                                                             cfg.placement))
        t0 = now + (cfg.restore_overhead if job.id in self.ran else 0.0)
        base = self.saved.get(job.id, 0.0)
        self._seq += 1
        finish = t0 + max(0.0, job.duration - base) / rate
        p = _Proc(ins.attempt, t0, rate, base, self._seq, now, finish, finish, ins.allocation)
        self.procs[job.id] = p
        b = None if self.behaviour is None else self.behaviour(job, ins.attempt)
        if b is None:
            heapq.heappush(self._heap, (finish, self._seq, job.id, ins.attempt))
            return Started(job.id, ins.attempt, t0, rate, cfg.checkpoint_interval)
        ranks = tuple(b.for_rank(r) for r in range(max(1, len(ins.allocation.slots))))
        p.script = _Script(ranks, any(r.checkpoints is not None for r in ranks))
        self._plan(p)
        self._watch(job.id, p)
        return Started(job.id, ins.attempt, t0, rate,
                       0.0 if p.script.explicit else cfg.checkpoint_interval)

    def _stop(self, ins: Stop, now: float, grace: float) -> list[Event]:
        p = self.procs.get(ins.job_id)
        if p is None or p.attempt != ins.attempt:
            return []  # it has ended already, or never ran here
        jid, out = ins.job_id, []
        if p.script is not None:
            p.script.stops.append((now, grace, ins.checkpoint))
            self._plan(p)
            if not self._deliver(jid, p, now, out):
                self._watch(jid, p)  # it ends later: killed when the grace runs out
            return out
        del self.procs[jid]
        every = self.config.checkpoint_interval
        progress = self._progress(jid, p, now)
        self.ran.add(jid)
        if grace <= 0:  # SIGKILL: no time to save
            if every > 0:
                self.saved[jid] = periodic_checkpoint(progress, self.saved.get(jid, 0.0), every)
            return [Exited(jid, ins.attempt, KILLED_EXIT_CODE)]
        if ins.checkpoint or every <= 0:
            self.saved[jid] = progress
            out.append(CheckpointSaved(jid, ins.attempt, now))
        else:
            self.saved[jid] = periodic_checkpoint(progress, self.saved.get(jid, 0.0), every)
        out.append(Exited(jid, ins.attempt, STOPPED_EXIT_CODE))
        return out

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
        every = self.config.checkpoint_interval
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

    def _deliver(self, jid: int, p: _Proc, now: float, out: list[Event]) -> bool:
        """Append a behaving attempt's saves due by `now`, then its end if due; True if it
        ended."""
        sc = p.script
        assert sc is not None
        while sc.reported < len(sc.saves) and sc.saves[sc.reported][0] <= now:
            at, step = sc.saves[sc.reported]
            sc.reported += 1
            out.append(CheckpointSaved(jid, p.attempt, at, step))
        if p.end > now:
            return False
        del self.procs[jid]
        out.append(self._ended(jid, p))
        return True

    def _ended(self, jid: int, p: _Proc) -> Event:
        """A behaving attempt's end event; what it saved is what its next attempt resumes
        from (the periodic cadence, unless it lists its saves: as the owner counts it)."""
        sc = p.script
        if sc is None:  # the default model, adopted after a restart: its work is done
            return Exited(jid, p.attempt, 0)
        saved = self.saved.get(jid, 0.0)
        if sc.saves:
            saved = self._progress(jid, p, sc.saves[-1][0])
        every = self.config.checkpoint_interval
        if not sc.explicit and every > 0:
            saved = periodic_checkpoint(self._progress(jid, p, p.end), saved, every)
        self.saved[jid] = saved
        self.ran.add(jid)
        if sc.exit_code is None:
            return Lost(jid, p.attempt, sc.message)
        return Exited(jid, p.attempt, sc.exit_code, sc.message)

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
            raise RuntimeError("this simulated runtime was restarted: use the one restart() "
                               "returned")

"""The simulated runtime: jobs "run" in virtual time at the throughput model's speed.

It is what the simulator puts where the platform has processes. It carries out the owner's
instructions and reports what real processes would:

- `Launch`: a `Started` event. The attempt resumes from what the job last saved, after the
  restore overhead if it ran before, at `rate = speed(job type, GPU model) x locality`. It also
  declares the job's checkpoint cadence (`SchedConfig.checkpoint_interval` units of work), so
  periodic checkpoints need no event each.
- `Stop`: the attempt exits at once with 143. With `checkpoint` (a lease ending, a move) it
  saves first and reports `CheckpointSaved`; otherwise it keeps only its last periodic
  checkpoint. A cadence of 0 models perfect checkpointing: every stop saves.
- Its finish: `Exited(0)` when the work is done, from `advance(now)`.

A job's true `duration` is known only here: policies see estimates, as on the platform.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from plinth.core.resources import Cluster
from plinth.core.throughput import job_type_for, speed
from plinth.core.workload import Job
from plinth.sched.owner import (
    CheckpointSaved,
    Event,
    Exited,
    Instruction,
    Launch,
    Started,
    Stop,
    periodic_checkpoint,
)
from plinth.sched.placement import locality_factor
from plinth.sched.types import SchedConfig

STOPPED_EXIT_CODE = 143  # what a job that honours SIGTERM exits with (128 + 15)


@dataclass(slots=True)
class _Proc:
    attempt: int
    t0: float  # progress begins (after the restore)
    rate: float
    base: float  # progress it resumed from


class SimRuntime:
    capabilities = frozenset({"checkpoint", "relaunch"})

    def __init__(self, cluster: Cluster, config: SchedConfig, jobs: Mapping[int, Job]) -> None:
        self.cluster, self.config, self.jobs = cluster, config, jobs
        self.saved: dict[int, float] = {}  # job -> progress its last checkpoint holds
        self.ran: set[int] = set()  # jobs stopped before: a restart pays the restore
        self.procs: dict[int, _Proc] = {}
        self._heap: list[tuple[float, int, int, int]] = []  # (finish, seq, job, attempt)
        self._seq = 0

    def next_time(self) -> float | None:
        """When the next running attempt finishes."""
        heap, procs = self._heap, self.procs
        while heap and (heap[0][2] not in procs or procs[heap[0][2]].attempt != heap[0][3]):
            heapq.heappop(heap)  # an attempt stopped before it finished
        return heap[0][0] if heap else None

    def advance(self, now: float) -> list[Event]:
        """`Exited(0)` for every attempt that finishes at `now`, in launch order."""
        out: list[Event] = []
        heap, procs = self._heap, self.procs
        while heap and heap[0][0] <= now:
            _, _, jid, attempt = heapq.heappop(heap)
            p = procs.get(jid)
            if p is not None and p.attempt == attempt:
                del procs[jid]
                out.append(Exited(jid, attempt, 0))
        return out

    def execute(self, instructions: Iterable[Instruction], now: float) -> list[Event]:
        out: list[Event] = []
        for ins in instructions:
            if type(ins) is Launch:
                out.append(self._launch(ins, now))
            else:
                out.extend(self._stop(ins, now))  # type: ignore[arg-type]
        return out

    def _launch(self, ins: Launch, now: float) -> Event:
        job, cfg = self.jobs[ins.job_id], self.config
        rate = speed(job.job_type or job_type_for(job.id), ins.model) * \
            locality_factor(self.cluster, ins.allocation, cfg.placement)
        t0 = now + (cfg.restore_overhead if job.id in self.ran else 0.0)
        base = self.saved.get(job.id, 0.0)
        self.procs[job.id] = _Proc(ins.attempt, t0, rate, base)
        self._seq += 1
        heapq.heappush(self._heap, (t0 + max(0.0, job.duration - base) / rate, self._seq,
                                    job.id, ins.attempt))
        return Started(job.id, ins.attempt, t0, rate, cfg.checkpoint_interval)

    def _stop(self, ins: Stop, now: float) -> list[Event]:
        p = self.procs.pop(ins.job_id, None)
        if p is None or p.attempt != ins.attempt:
            return []
        jid, every = ins.job_id, self.config.checkpoint_interval
        ran = now - p.t0
        progress = min(p.base + p.rate * ran if ran > 0 else p.base, self.jobs[jid].duration)
        self.ran.add(jid)
        out: list[Event] = []
        if ins.checkpoint or every <= 0:
            self.saved[jid] = progress
            out.append(CheckpointSaved(jid, ins.attempt, now))
        else:
            self.saved[jid] = periodic_checkpoint(progress, self.saved.get(jid, 0.0), every)
        out.append(Exited(jid, ins.attempt, STOPPED_EXIT_CODE))
        return out

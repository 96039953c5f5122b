"""The runtime protocol: what a shell (the control plane, the simulator) asks of whatever
carries out the scheduler's decisions, and what it hears back.

A runtime launches a job's workers on an allocation, stops them with a grace period, reports what
happened to them as events, and re-adopts the workers of a previous control plane after a crash.
The local runtime (processes on this machine), the Ray runtime and the simulated one (virtual
time, `plinth.runtime.sim`) all implement it and pass the same contract tests
(tests/runtime/test_contract.py). It lives in `core`, below both `sched` and `runtime`, so that
the one driver of the owner (`plinth.sched.driver`) can speak to any runtime without importing
one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from plinth.core.resources import Allocation, Cluster, Node, Request


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """One worker of a gang: its rank, where it runs, and its limits."""

    rank: int
    node: str
    gpus: tuple[int, ...] = ()  # GPU indices local to `node`
    gpu_milli: int = 1000  # share of each GPU in `gpus` (1000 = the whole GPU)
    gpu_memory_mib: int = 0  # GPU memory limit for a fractional share (0 = none)
    cpus_milli: int = 0  # 0 = no CPU limit
    memory_mib: int = 0  # 0 = no memory limit


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one attempt of a job."""

    job_id: int
    attempt: int
    command: tuple[str, ...]  # argv; a shell command is ("/bin/sh", "-c", "...")
    workers: tuple[WorkerLaunch, ...]
    log_path: str  # all workers append to this one file
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    checkpoint_dir: str | None = None  # exported as PLINTH_CHECKPOINT_DIR
    run_as: str | None = None  # the Unix user the command runs as (a root runtime only)


@dataclass(frozen=True, slots=True)
class ProcRef:
    """A launched process, identified so that a pid reused by another process is not mistaken
    for it: the pid, its start time as the kernel reports it, and where its exit code goes.
    `start_ticks` is the kernel's start time in clock ticks since boot (0: not recorded, a
    handle stored before it was): unlike `start_time`, which is derived from the boot time on
    the wall clock, it does not move when that clock is stepped (NTP, a VM resumed from a
    snapshot), so a restarted control plane still recognises its workers."""

    pid: int
    start_time: float
    exit_file: str
    start_ticks: int = 0


@dataclass(frozen=True, slots=True)
class Handle:
    """The durable record of a launched attempt; the control plane stores it (`to_dict`) and
    gives it back to `adopt` after a restart."""

    job_id: int
    attempt: int
    procs: tuple[ProcRef, ...]
    checkpoint_dir: str | None = None  # watched for checkpoint markers after adoption too

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "attempt": self.attempt,
                "procs": [[p.pid, p.start_time, p.exit_file, p.start_ticks]
                          for p in self.procs],
                "checkpoint_dir": self.checkpoint_dir}

    @classmethod
    def from_dict(cls, d: Mapping) -> Handle:
        ckpt = d.get("checkpoint_dir")  # absent in handles stored before it existed
        return cls(int(d["job_id"]), int(d["attempt"]),
                   tuple(ProcRef(int(p[0]), float(p[1]), str(p[2]),
                                 int(p[3]) if len(p) > 3 else 0) for p in d["procs"]),
                   None if ckpt is None else str(ckpt))


class EventKind(enum.Enum):
    # The attempt's work began at `at`, at `rate` units of work per second, saving every
    # `checkpoint_every` units (0: it reports its saves): a runtime that models progress says
    # so ("progress" in its capabilities: the simulated one). For any other, an attempt has
    # started when `launch` returns, at rate 1.
    STARTED = "started"
    EXITED = "exited"  # every worker has exited; exit_code is the first non-zero code, else 0
    LOST = "lost"  # the workers vanished without leaving an exit code
    CHECKPOINTED = "checkpointed"  # the job saved a checkpoint: `step`, written at `at`


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    job_id: int
    attempt: int
    kind: EventKind
    exit_code: int | None = None
    message: str = ""
    step: int | None = None  # CHECKPOINTED: the step the job saved
    # STARTED: when its work begins; CHECKPOINTED: when it was written (the runtime's clock);
    # EXITED of an attempt that ended while no runtime watched it: when it ended.
    at: float | None = None
    rate: float = 1.0  # STARTED: units of work per second
    checkpoint_every: float = 0.0  # STARTED: the save cadence in units of work (0: reported)


class Runtime(Protocol):
    """What every runtime provides. Events are delivered by `poll`; `notify` (given to the
    constructor) is called from any thread when new events are ready, to wake the control loop.
    `capabilities` names what it can do beyond launch and stop ("checkpoint": a stop lets the
    job save first; "relaunch": a job's next attempt may start on other GPUs; "elastic": its
    nodes may leave and come back, so `nodes()` is read again while it runs; "concurrent-launch":
    `launch` may be called from several threads at once, and is worth it because each call
    waits on a cluster; "progress": it reports each attempt's STARTED, with the speed it runs
    at); a policy that needs more is refused at start-up."""

    capabilities: frozenset[str]

    def nodes(self) -> list[Node]:
        """The nodes this runtime can place work on."""
        ...

    def launch(self, spec: LaunchSpec) -> Handle:
        """Start every worker of `spec`, or none (raise, leaving nothing running)."""
        ...

    def stop(self, job_id: int, attempt: int, grace_s: float, *, checkpoint: bool = False
             ) -> None:
        """SIGTERM every worker, SIGKILL those still alive after `grace_s`. Returns at once;
        the end is reported as an EXITED event. `checkpoint`: the scheduler wants the job to
        save as it stops (a lease ending, a move). A real job saves on every SIGTERM it can,
        so only the simulated runtime, whose jobs save at their cadence otherwise, reads it."""
        ...

    def adopt(self, handle: Handle) -> bool:
        """Take over an attempt launched by an earlier control plane. True if its workers still
        run (and are now watched); otherwise an EXITED or LOST event is queued and False returned."""
        ...

    def find(self, job_id: int, attempt: int, workers: int) -> Handle | None:
        """The handle of an attempt launched by a control plane that died before it stored it
        (for `adopt`); None if it never started, after killing the part of its `workers`-wide
        gang that did, which would otherwise run on unwatched."""
        ...

    def poll(self) -> list[RuntimeEvent]:
        """Events since the last call, without blocking."""
        ...

    def close(self) -> None:
        """Stop watching and release runtime resources (MPS daemons). Running jobs are left
        running, so that a restarted control plane can adopt them."""
        ...


class VirtualRuntime(Runtime, Protocol):
    """A runtime on a virtual clock (the simulated one): nothing happens between the times it
    names, so the clock may jump to the next one."""

    def next_time(self) -> float | None:
        """When the next event of a watched attempt is due; None if none will come unless
        asked (a launch, a stop)."""
        ...


def worker_launches(cluster: Cluster, allocation: Allocation, request: Request
                    ) -> tuple[WorkerLaunch, ...]:
    """The workers of an attempt on `allocation`, as a LaunchSpec names them: rank i on slot i,
    its GPUs numbered as its node numbers them, the request's CPU and memory limits."""
    out = []
    for rank, slot in enumerate(allocation.slots):
        first = cluster.node_gpu_range[slot.node][0]
        out.append(WorkerLaunch(rank=rank, node=cluster.nodes[slot.node].name,
                                gpus=tuple(g - first for g in slot.gpus), gpu_milli=slot.milli,
                                gpu_memory_mib=slot.gpu_memory_mib,
                                cpus_milli=request.cpus_milli, memory_mib=request.memory_mib))
    return tuple(out)


NODE_ADDRESS = "PLINTH_NODE_ADDRESS"  # a unit binds and advertises this address, its node's


def gang_env(spec: LaunchSpec, *, master_addr: str, master_port: int,
             addresses: Mapping[str, str] | None = None) -> dict[int, dict[str, str]]:
    """The variables every runtime gives each worker of `spec`, by rank: the torch.distributed
    rendezvous (MASTER_ADDR/PORT, RANK, WORLD_SIZE, and LOCAL_RANK/LOCAL_WORLD_SIZE among the
    workers on the same node), which job and attempt it is, its checkpoint directory,
    CUDA_VISIBLE_DEVICES with its GPUs as its node numbers them (a runtime whose nodes share a
    machine maps them to the machine's numbering), and PLINTH_NODE_ADDRESS: the address of its
    node that the other nodes reach it at (`addresses` by node name; else `master_addr`, for a
    runtime whose nodes are one machine)."""
    out: dict[int, dict[str, str]] = {}
    ordered = sorted(spec.workers, key=lambda w: w.rank)
    for w in ordered:
        peers = [o.rank for o in ordered if o.node == w.node]
        env = {"PLINTH_JOB_ID": str(spec.job_id), "PLINTH_ATTEMPT": str(spec.attempt),
               "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
               "RANK": str(w.rank), "WORLD_SIZE": str(len(ordered)),
               "LOCAL_RANK": str(peers.index(w.rank)), "LOCAL_WORLD_SIZE": str(len(peers)),
               "CUDA_VISIBLE_DEVICES": ",".join(map(str, w.gpus)),
               NODE_ADDRESS: (addresses or {}).get(w.node, master_addr)}
        if spec.checkpoint_dir:
            env["PLINTH_CHECKPOINT_DIR"] = spec.checkpoint_dir
        out[w.rank] = env
    return out

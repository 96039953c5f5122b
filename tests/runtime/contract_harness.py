"""Harnesses for the runtime contract suite (test_contract.py): one per runtime, same tests.

A test describes what a job does as a `Scenario` and drives a `Harness`: launch, stop, advance
time, read events, restart the runtime. Each runtime plugs in by subclassing `Harness` and adding
itself to `HARNESSES`:

- `LocalHarness` turns a scenario into a real command (scenario_worker.py, which acts it out with
  the job SDK) and advances real time, polling the runtime.
- `SimHarness` turns a scenario into the simulated job's script (a `SimBehaviour` per rank: it
  exits at `duration_s` with `exit_code`, saves at `checkpoints`, ignores SIGTERM until the grace
  ends, vanishes) and advances virtual time, stepping to the instant of every event; its
  `worker_env` is the environment the runtime would set (`SimRuntime.worker_env`, which is
  plinth.core.runtime.gang_env on the workers of the launch). It drives the simulated runtime
  through the same protocol as the local one: launch, stop, poll, close, adopt and find.

Times in a scenario count from the moment `launch` returns; `launch` returns once every worker
acts the scenario out (for real processes: once each has installed its SIGTERM handler).
`seen_at(event)` is when the harness got an event, on the runtime's clock: a real runtime's is
late by up to its polling (`late_s`), a virtual one's is the instant it happened.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path

from plinth.core.clock import VirtualClock
from plinth.core.resources import Cluster, Node, Request
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.runtime import EventKind, Handle, LaunchSpec, LocalRuntime, RuntimeEvent, WorkerLaunch
from plinth.runtime.sim import SimRuntime
from plinth.runtime.sim_behaviour import SimBehaviour
from plinth.sched.types import SchedConfig

FOREVER_S = 3600.0  # a duration that only a stop ends
TERMINAL = (EventKind.EXITED, EventKind.LOST)
WORKER = Path(__file__).with_name("scenario_worker.py")
# Job ids of their own, so that nothing here is mistaken for another test's processes.
_JOB_IDS = count(7100)


@dataclass(frozen=True)
class Scenario:
    """What every worker of a job does; `ranks` overrides it for some ranks."""

    duration_s: float = 0.3  # then it exits on its own (or vanishes)
    exit_code: int = 0
    ignore_term: bool = False  # SIGTERM does nothing: only the SIGKILL after the grace ends it
    checkpoints: tuple[tuple[float, int], ...] = ()  # (seconds after launch, step), in order
    vanish: bool = False  # at `duration_s` it is killed and leaves no exit code: LOST
    ranks: Mapping[int, Scenario] = field(default_factory=dict)

    def for_rank(self, rank: int) -> Scenario:
        return self.ranks.get(rank, self)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def key(x: Handle | RuntimeEvent) -> tuple[int, int]:
    return (x.job_id, x.attempt)


class Harness(ABC):
    """One runtime under the contract tests. Subclasses provide the abstract methods; the
    shared ones (events, waiting for an end, the invariants) are written on top of them."""

    name: str
    tick_s: float = 0.05  # how far `run_until` advances per step
    timeout_s: float = 60.0  # how long `run_until` waits (runtime clock) before failing
    # How far `seen_at` may be from the instant an event was due (timing checks): before it
    # (clock granularity), and after it (polling, a loaded machine).
    early_s: float = 0.0
    late_s: float = 0.0

    def __init__(self) -> None:
        self.launched: list[Handle] = []
        self._seen: list[RuntimeEvent] = []
        self._seen_at: list[float] = []

    # -------------------------------------------------------------- what each runtime provides

    @abstractmethod
    def launch(self, scenario: Scenario, *, workers: int = 1, gpus_per_worker: int = 0,
               job_id: int | None = None, attempt: int = 1) -> Handle:
        """Launch `workers` workers acting out `scenario` on the first node, worker r on GPUs
        r*g .. r*g+g-1 of it; return once all act it out. A new job id unless one is given (a
        later attempt of a job shares its checkpoint directory)."""

    @abstractmethod
    def stop(self, handle: Handle, grace_s: float) -> None: ...

    @abstractmethod
    def advance(self, seconds: float) -> None:
        """Let `seconds` pass on the runtime's clock (real or virtual)."""

    @abstractmethod
    def now(self) -> float:
        """The runtime's clock, the one CHECKPOINTED.at is on."""

    @abstractmethod
    def worker_env(self, handle: Handle, rank: int) -> dict[str, str]:
        """The environment worker `rank` got (or, without processes, would get)."""

    @abstractmethod
    def restart(self, down_s: float = 0.0, *, recorded: bool = True) -> None:
        """Close the runtime, let `down_s` pass with none, and start a new one that adopts every
        launched attempt not yet seen to end: from handles round-tripped through JSON, or, when
        not `recorded` (a control plane killed before it stored them), found by the runtime."""

    @abstractmethod
    def close(self) -> None:
        """Kill whatever still runs and release the runtime."""

    @abstractmethod
    def checkpoint_dir(self, handle: Handle) -> str: ...

    @abstractmethod
    def _poll(self) -> list[RuntimeEvent]: ...

    # -------------------------------------------------------------- shared

    def _adopt_all(self, recorded: bool) -> None:
        """For a runtime with handles (`self.rt`): adopt what was launched and has not ended."""
        ended = {key(e) for e in self._seen if e.kind in TERMINAL}
        for h in self.launched:
            if key(h) in ended:
                continue
            if recorded:
                self.rt.adopt(Handle.from_dict(json.loads(json.dumps(h.to_dict()))))
            else:
                found = self.rt.find(h.job_id, h.attempt, len(h.procs))
                assert found == h, f"{self.name}: find gave {found}, launch gave {h}"
                self.rt.adopt(found)

    def events(self) -> list[RuntimeEvent]:
        """Every event so far, in the order the runtime delivered them (across restarts)."""
        new = self._poll()
        self._seen += new
        self._seen_at += [self.now()] * len(new)
        return list(self._seen)

    def seen_at(self, event: RuntimeEvent) -> float:
        """When `events` first returned this very event, on the runtime's clock."""
        return next(t for e, t in zip(self._seen, self._seen_at, strict=True) if e is event)

    def events_of(self, handle: Handle) -> list[RuntimeEvent]:
        return [e for e in self.events() if key(e) == key(handle)]

    def run_until(self, cond: Callable[[], object], what: str,
                  timeout_s: float | None = None) -> None:
        end = self.now() + (self.timeout_s if timeout_s is None else timeout_s)
        while not cond():
            if self.now() >= end:
                raise AssertionError(f"{self.name}: timed out waiting for {what}; "
                                     f"events so far: {self.events()}")
            self.advance(self.tick_s)

    def terminal(self, handle: Handle) -> RuntimeEvent:
        """Advance until the attempt's EXITED or LOST event; return it."""
        found: list[RuntimeEvent] = []

        def ended() -> bool:
            found[:] = [e for e in self.events_of(handle) if e.kind in TERMINAL]
            return bool(found)

        self.run_until(ended, f"the end of job {handle.job_id} attempt {handle.attempt}")
        return found[0]

    def check_invariants(self, settle_s: float = 0.3) -> None:
        """What holds in every test: events only for launched attempts; at most one terminal
        event per attempt and nothing after it; checkpoint steps never go back, and a step seen
        twice (a re-report after a restart) is the same save."""
        self.advance(settle_s)  # time for an event that should not come
        evs = self.events()
        keys = {key(h) for h in self.launched}
        assert all(key(e) in keys for e in evs), evs
        for k in keys:
            mine = [e for e in evs if key(e) == k]
            ends = [i for i, e in enumerate(mine) if e.kind in TERMINAL]
            assert ends in ([], [len(mine) - 1]), f"{self.name}: {k}: {mine}"
            saves = [(e.step, e.at) for e in mine if e.kind is EventKind.CHECKPOINTED]
            for (s0, a0), (s1, a1) in zip(saves, saves[1:], strict=False):
                assert s0 < s1 or (s0, a0) == (s1, a1), f"{self.name}: {k}: {saves}"


class LocalHarness(Harness):
    """The local runtime with real processes, on 4 fake A100s."""

    name = "local"
    FAKE_GPUS = "4xA100"
    early_s = 0.05  # time.time against the runtime's monotonic deadlines
    late_s = 10.0  # a 50 ms watcher and polling, on a shared machine

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.dir = tmp
        self.home = tmp / "home"
        self.rt = LocalRuntime(self.home, fake_gpus=self.FAKE_GPUS)

    def launch(self, scenario: Scenario, *, workers: int = 1, gpus_per_worker: int = 0,
               job_id: int | None = None, attempt: int = 1) -> Handle:
        job_id = next(_JOB_IDS) if job_id is None else job_id
        node = self.rt.nodes()[0].name
        g = gpus_per_worker
        ws = tuple(WorkerLaunch(r, node, gpus=tuple(range(r * g, (r + 1) * g)))
                   for r in range(workers))
        report = self._report_dir(job_id, attempt)
        report.mkdir(parents=True)
        spec = LaunchSpec(job_id, attempt, (sys.executable, str(WORKER), scenario.to_json(),
                                            str(report)),
                          ws, str(self.dir / f"job{job_id}.log"),
                          checkpoint_dir=str(self.dir / f"ck{job_id}"))
        h = self.rt.launch(spec)
        self.launched.append(h)

        def ready() -> bool:
            if any(e.kind in TERMINAL for e in self.events_of(h)):
                log = Path(spec.log_path).read_text()[-2000:]
                raise AssertionError(f"job {job_id} ended before it was ready: "
                                     f"{self.events_of(h)}\n{log}")
            return all((report / f"env-{r}.json").exists() for r in range(workers))

        self.run_until(ready, f"job {job_id}'s workers to start")
        return h

    def stop(self, handle: Handle, grace_s: float) -> None:
        self.rt.stop(handle.job_id, handle.attempt, grace_s)

    def advance(self, seconds: float) -> None:
        time.sleep(seconds)

    def now(self) -> float:
        return time.time()

    def worker_env(self, handle: Handle, rank: int) -> dict[str, str]:
        path = self._report_dir(handle.job_id, handle.attempt) / f"env-{rank}.json"
        return json.loads(path.read_text())

    def checkpoint_dir(self, handle: Handle) -> str:
        return str(self.dir / f"ck{handle.job_id}")

    def restart(self, down_s: float = 0.0, *, recorded: bool = True) -> None:
        self.rt.close()
        self.events()  # what the old runtime queued before it closed
        time.sleep(down_s)
        self.rt = LocalRuntime(self.home, fake_gpus=self.FAKE_GPUS)
        self._adopt_all(recorded)

    def close(self) -> None:
        for job_id, attempt in self.rt.running():
            self.rt.stop(job_id, attempt, 0)
        end = time.monotonic() + self.timeout_s
        while self.rt.running() and time.monotonic() < end:
            time.sleep(0.02)
        self.rt.close()

    def _poll(self) -> list[RuntimeEvent]:
        return self.rt.poll()

    def _report_dir(self, job_id: int, attempt: int) -> Path:
        return self.dir / f"report-j{job_id}-a{attempt}"


class SimHarness(Harness):
    """The simulated runtime in virtual time, on one node of 4 A100s (as LocalHarness's fake
    ones), through the runtime protocol as the local harness drives its runtime. Each launch's
    scenario becomes its behaviour; `advance` moves the virtual clock to each event's instant,
    so `seen_at` is exact and timing holds to the float. Its STARTED reports (the "progress"
    capability, which the others lack) are checked at each launch and kept out of the
    shared checks."""

    name = "sim"
    early_s = late_s = 1e-9

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.dir = tmp
        self.cluster = Cluster((Node("sim-0", 64_000, 256_000, "A100", 4),), name="contract")
        self.jobs: dict[int, Job] = {}
        self.scripts: dict[tuple[int, int], SimBehaviour] = {}
        self.envs: dict[tuple[int, int], dict[int, dict[str, str]]] = {}
        self.starts: list[RuntimeEvent] = []
        self.clock = VirtualClock()
        # A scenario acts out its script from the launch: no restore time before it.
        work = SchedConfig(restore_overhead=0.0).work_model(self.cluster)
        self.rt = SimRuntime(self.cluster, work, self.jobs, clock=self.clock,
                             behaviour=lambda job, attempt: self.scripts[(job.id, attempt)])

    def launch(self, scenario: Scenario, *, workers: int = 1, gpus_per_worker: int = 0,
               job_id: int | None = None, attempt: int = 1) -> Handle:
        job_id = next(_JOB_IDS) if job_id is None else job_id
        g = gpus_per_worker
        node = self.cluster.nodes[0].name
        ws = tuple(WorkerLaunch(r, node, gpus=tuple(range(r * g, (r + 1) * g)))
                   for r in range(workers))
        # At fixed speed, so that its work takes `duration_s`; each rank exits on its script.
        self.jobs[job_id] = Job(job_id, self.now(), scenario.duration_s,
                                Request(gpus=g, workers=workers), job_type=FIXED_SPEED)
        self.scripts[(job_id, attempt)] = sim_behaviour(scenario, workers)
        h = self.rt.launch(LaunchSpec(job_id, attempt, (), ws, str(self.dir / f"job{job_id}.log"),
                                      checkpoint_dir=self.checkpoint_dir_of(job_id)))
        self.launched.append(h)
        self.events()
        assert [(e.job_id, e.attempt, e.at) for e in self.starts[-1:]] == \
            [(job_id, attempt, self.now())], self.starts
        self.envs[(job_id, attempt)] = self.rt.worker_env(job_id, attempt)
        return h

    def stop(self, handle: Handle, grace_s: float) -> None:
        self.rt.stop(handle.job_id, handle.attempt, grace_s)

    def advance(self, seconds: float) -> None:
        self.events()  # what came before this instant (a stop's, an adoption's) is of it
        end = self.now() + seconds
        while (t := self.rt.next_time()) is not None and t <= end:
            self.clock.to(max(self.now(), t))
            self.events()  # stamped with the instant they happened
        self.clock.to(end)

    def now(self) -> float:
        return self.clock()

    def worker_env(self, handle: Handle, rank: int) -> dict[str, str]:
        return self.envs[key(handle)][rank]

    def checkpoint_dir(self, handle: Handle) -> str:
        return self.checkpoint_dir_of(handle.job_id)

    def checkpoint_dir_of(self, job_id: int) -> str:
        return str(self.dir / f"ck{job_id}")

    def restart(self, down_s: float = 0.0, *, recorded: bool = True) -> None:
        self.rt.close()
        self.events()  # what the old runtime queued before it went down
        self.rt = self.rt.restart()
        self.clock.to(self.now() + down_s)  # the processes run on; no runtime watches them
        self._adopt_all(recorded)

    def close(self) -> None:
        self.rt.procs.clear()  # nothing is held outside this object

    def _poll(self) -> list[RuntimeEvent]:
        out = []
        for e in self.rt.poll():
            (self.starts if e.kind is EventKind.STARTED else out).append(e)
        return out


def sim_behaviour(scenario: Scenario, workers: int) -> SimBehaviour:
    """The scenario as the simulated job's script, rank by rank (times from the launch)."""

    def one(s: Scenario) -> SimBehaviour:
        return SimBehaviour(exit_code=s.exit_code, exit_at=s.duration_s,
                            vanish_at=s.duration_s if s.vanish else None,
                            ignore_term=s.ignore_term, checkpoints=tuple(s.checkpoints))

    ranks = {r: one(scenario.for_rank(r)) for r in range(workers) if r in scenario.ranks}
    return dataclasses.replace(one(scenario), ranks=ranks)


class RayHarness(LocalHarness):
    """The Ray runtime on a real 2-node Ray cluster on 127.0.0.1 (ray_cluster.py), with real
    processes under Ray actors, on its head node's 4 fake A100s. Launching, stopping and reading
    what a worker saw are the local harness's: the nodes share this machine's file system. A
    restart is a real one: this driver leaves Ray and a new one joins and adopts by name. Not
    in HARNESSES, so that the suite runs on Ray only where the cluster is up (test_contract_ray.py).
    """

    name = "ray"
    late_s = 15.0  # actor calls and Ray's own processes, on a shared 2-core machine

    def __init__(self, tmp: Path, address: str) -> None:
        from plinth.runtime.ray import RayRuntime

        Harness.__init__(self)
        self.dir = tmp
        self.address = address
        self.rt = RayRuntime(address)

    def restart(self, down_s: float = 0.0, *, recorded: bool = True) -> None:
        from plinth.runtime.ray import RayRuntime

        self.rt.close()
        self.events()
        time.sleep(down_s)
        self.rt = RayRuntime(self.address)
        self._adopt_all(recorded)


# The runtimes the contract suite runs against, by name.
HARNESSES: dict[str, Callable[[Path], Harness]] = {"local": LocalHarness, "sim": SimHarness}

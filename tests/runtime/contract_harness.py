"""Harnesses for the runtime contract suite (test_contract.py): one per runtime, same tests.

A test describes what a job does as a `Scenario` and drives a `Harness`: launch, stop, advance
time, read events, restart the runtime. Each runtime plugs in by subclassing `Harness` and adding
itself to `HARNESSES`:

- `LocalHarness` turns a scenario into a real command (scenario_worker.py, which acts it out with
  the job SDK) and advances real time, polling the runtime.
- A simulated runtime's harness turns a scenario into its virtual job's script (it exits at
  `duration_s` with `exit_code`, saves at `checkpoints`, ignores SIGTERM until the grace ends,
  vanishes) and advances virtual time; its `worker_env` returns the environment the runtime would
  set (plinth.runtime.local.gang_env computes it for any LaunchSpec).

Times in a scenario count from the moment `launch` returns; `launch` returns once every worker
acts the scenario out (for real processes: once each has installed its SIGTERM handler).
"""

from __future__ import annotations

import json
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path

from plinth.runtime import EventKind, Handle, LaunchSpec, LocalRuntime, RuntimeEvent, WorkerLaunch

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

    def __init__(self) -> None:
        self.launched: list[Handle] = []
        self._seen: list[RuntimeEvent] = []

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
    def restart(self, down_s: float = 0.0) -> None:
        """Close the runtime, let `down_s` pass with none, and start a new one that adopts every
        launched attempt not yet seen to end (from handles round-tripped through JSON)."""

    @abstractmethod
    def close(self) -> None:
        """Kill whatever still runs and release the runtime."""

    @abstractmethod
    def checkpoint_dir(self, handle: Handle) -> str: ...

    @abstractmethod
    def _poll(self) -> list[RuntimeEvent]: ...

    # -------------------------------------------------------------- shared

    def events(self) -> list[RuntimeEvent]:
        """Every event so far, in the order the runtime delivered them (across restarts)."""
        self._seen += self._poll()
        return list(self._seen)

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

    def restart(self, down_s: float = 0.0) -> None:
        self.rt.close()
        self.events()  # what the old runtime queued before it closed
        time.sleep(down_s)
        self.rt = LocalRuntime(self.home, fake_gpus=self.FAKE_GPUS)
        ended = {key(e) for e in self._seen if e.kind in TERMINAL}
        for h in self.launched:
            if key(h) not in ended:
                self.rt.adopt(Handle.from_dict(json.loads(json.dumps(h.to_dict()))))

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


# The runtimes the contract suite runs against, by name.
HARNESSES: dict[str, Callable[[Path], Harness]] = {"local": LocalHarness}

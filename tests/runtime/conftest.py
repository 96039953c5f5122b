"""Helpers for runtime tests: a runtime on a temporary home, specs, and waiting with a deadline."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from plinth.runtime import EventKind, LaunchSpec, LocalRuntime, RuntimeEvent, WorkerLaunch

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "jobs"
PY = sys.executable
# Job ids no other test on this shared machine uses: a test that looks for its job's processes by
# PLINTH_JOB_ID must not find (and kill) ours.
JOB = 7001
DEADLINE_S = 60.0  # generous: the machine is shared; tests never assert on time


def wait_for(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> object:
    """Poll `cond` until it returns something truthy; fail naming `what` at the deadline."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_events(rt: LocalRuntime, n: int = 1, timeout: float = DEADLINE_S) -> list[RuntimeEvent]:
    got: list[RuntimeEvent] = []

    def enough() -> bool:
        got.extend(rt.poll())
        return len(got) >= n

    wait_for(enough, f"{n} runtime event(s)", timeout)
    return got


def wait_end(rt: LocalRuntime, timeout: float = DEADLINE_S) -> tuple[RuntimeEvent,
                                                                     list[RuntimeEvent]]:
    """Events up to the first EXITED or LOST: (that event, the CHECKPOINTED events before it)."""
    got: list[RuntimeEvent] = []

    def ended() -> bool:
        got.extend(rt.poll())
        return any(e.kind is not EventKind.CHECKPOINTED for e in got)

    wait_for(ended, "the end of an attempt", timeout)
    end = next(e for e in got if e.kind is not EventKind.CHECKPOINTED)
    return end, got[:got.index(end)]


def spec(home: Path, command: tuple[str, ...], *, workers: int = 1, job_id: int = JOB,
         attempt: int = 1, **kw) -> LaunchSpec:
    ws = kw.pop("worker_list", None) or tuple(WorkerLaunch(r, "localhost") for r in range(workers))
    return LaunchSpec(job_id, attempt, tuple(command), ws, str(home / "job.log"), **kw)


def sh(script: str) -> tuple[str, ...]:
    return ("/bin/sh", "-c", script)


@pytest.fixture
def make_rt(tmp_path):
    """Runtimes on `tmp_path/home`; whatever they still run is killed at the end of the test."""
    made: list[LocalRuntime] = []

    def make(**kw) -> LocalRuntime:
        rt = LocalRuntime(tmp_path / "home", **kw)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        for job_id, attempt in rt.running():
            rt.stop(job_id, attempt, 0)
        if rt.running() and not rt.closed:
            wait_for(lambda rt=rt: not rt.running(), "leftover workers to be killed")
        rt.close()


@pytest.fixture
def rt(make_rt):
    return make_rt(fake_gpus="4xA100")


@pytest.fixture(scope="session")
def ray_cluster():
    """A 2-node Ray cluster on 127.0.0.1 for the whole session (tests marked `ray`)."""
    from ray_cluster import LocalRayCluster  # first: it sets what Ray reads on import

    pytest.importorskip("ray")

    cluster = LocalRayCluster()
    try:
        yield cluster
    finally:
        cluster.shutdown()

"""`plinth.runtime.pool`: a program's helper processes, started in one place."""

from __future__ import annotations

import os
from multiprocessing.connection import Pipe

import pytest

from plinth.runtime.pool import process_pool, spawn

_INIT: dict[str, str] = {}


def _report(conn) -> None:
    conn.send(os.getpid())
    conn.close()


def _init(value: str) -> None:
    _INIT["value"] = value


def _task(x: int) -> tuple[int, str | None, int]:
    return os.getpid(), _INIT.get("value"), 2 * x


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_runs_the_target_in_a_daemon_process_of_its_own(method):
    parent, child = Pipe()
    proc = spawn(_report, child, method=method, preload=["json"])
    child.close()
    assert parent.poll(120), "the process reported nothing"
    pid = parent.recv()
    proc.join(60)
    assert pid == proc.pid and pid != os.getpid()
    assert proc.daemon and proc.exitcode == 0


def test_a_process_pool_runs_its_initializer_in_each_worker_before_a_task():
    with process_pool(2, _init, ("ready",)) as pool:
        out = list(pool.map(_task, range(4)))
    assert [x for _, _, x in out] == [0, 2, 4, 6]
    assert {v for _, v, _ in out} == {"ready"}
    assert os.getpid() not in {pid for pid, _, _ in out}

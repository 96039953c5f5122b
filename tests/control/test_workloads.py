"""The workload reconciler (`plinth.control.workloads`) in a real control plane: a controller
is told once of each ended unit job, across a restart of the control plane."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Literal

import pytest
from pydantic import BaseModel

from plinth.control.kinds import CONTROLLERS
from plinth.core.kinds import BaseController, Observed, Unit
from plinth.control.service import ControlPlane
from plinth.core.jobspec import JobSpec
from plinth.control.store import Store
from plinth.core.spec import KINDS
from plinth.runtime.local import LocalRuntime


class OnceSpec(BaseModel):
    kind: Literal["OnceTest"] = "OnceTest"
    name: str = "once"
    tenant: str | None = None


class Once(BaseController):
    """Wants one unit that exits at once and is not replaced; counts the ends it is told of."""

    def units(self, w, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        if w.status.get("ends", 0):
            return []
        return [Unit("u", JobSpec(name="u", command=["true"]))]

    def unit_ended(self, w, unit: str, ctx) -> None:
        w.status["ends"] = w.status.get("ends", 0) + 1


@pytest.fixture
def once_kind() -> Iterator[None]:
    for reg, target in ((KINDS, OnceSpec), (CONTROLLERS, Once)):
        reg.add("OnceTest", target)
    yield
    for reg in (KINDS, CONTROLLERS):  # this worker's registries as they were
        for table in (reg._targets, reg._names):
            table.pop("oncetest", None)


def _plane(tmp_path, store: Store) -> ControlPlane:
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="1xA100"),
                      home=tmp_path)
    cp.start()
    return cp


def _wait(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _row(store: Store, wid: int) -> dict:
    return next(r for r in store.workloads() if r["id"] == wid)


def test_a_controller_is_told_of_an_ended_unit_once_across_a_restart(tmp_path,
                                                                      once_kind) -> None:
    store = Store(str(tmp_path / "plinth.db"))
    store.put_tenant("default", None, None)
    cp = _plane(tmp_path, store)
    try:
        wid = cp.workloads.submit(OnceSpec(), "default").id
        _wait(lambda: _row(store, wid)["status"].get("ends") == 1, "the unit's end to be told")
    finally:
        cp.close()
    cp = _plane(tmp_path, store)  # the unit's job is in the store, ended
    try:
        assert wid in cp.workloads.active
        time.sleep(3 * 1.0)  # three reconciles (RECONCILE_EVERY_S)
        assert cp.workloads.active[wid].status["ends"] == 1
        assert _row(store, wid)["status"]["ends"] == 1
        assert [j["state"] for j in store.units(wid)] == ["succeeded"]  # not replaced
    finally:
        cp.close()

"""The workload reconciler (`plinth.control.workloads`) in a control plane in virtual time
(virtual.py): a controller is told once of each ended unit job, across a restart of the
control plane."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

import pytest
from pydantic import BaseModel
from virtual import VirtualPlatform

from plinth.control.kinds import CONTROLLERS
from plinth.control.workloads import RECONCILE_EVERY_S
from plinth.core.jobspec import JobSpec
from plinth.core.kinds import BaseController, Observed, Unit
from plinth.core.spec import KINDS


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


def _row(store, wid: int) -> dict:
    return next(r for r in store.workloads() if r["id"] == wid)


def test_a_controller_is_told_of_an_ended_unit_once_across_a_restart(tmp_path,
                                                                      once_kind) -> None:
    with VirtualPlatform(tmp_path) as vp:  # the unit's job exits 0 one second after its launch
        wid = vp.cp.workloads.submit(OnceSpec(), "default").id
        vp.run_until(lambda: _row(vp.store, wid)["status"].get("ends") == 1, limit_s=30)
        vp.restart()  # the unit's job is in the store, ended
        assert wid in vp.cp.workloads.active
        vp.advance(3 * RECONCILE_EVERY_S)  # three reconciles
        assert vp.cp.workloads.active[wid].status["ends"] == 1
        assert _row(vp.store, wid)["status"]["ends"] == 1
        assert [j["state"] for j in vp.store.units(wid)] == ["succeeded"]  # not replaced

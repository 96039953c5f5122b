"""Workload kinds: controllers say which units a workload needs; reconcile diffs them."""

from __future__ import annotations

import pytest

from plinth.control.kinds import CONTROLLERS, Observed, Unit, controller_for, reconcile
from plinth.control.spec import JobSpec
from plinth.core.errors import SpecError
from plinth.core.spec import load_spec
from plinth.sched.lifecycle import State


def spec(**kw) -> JobSpec:
    return JobSpec.model_validate({"command": "true", **kw})


def test_a_job_is_one_unit_wanted_once():
    c = controller_for(spec())
    (u,) = c.units(spec(), {}, 0.0)
    assert u.name == "job" and u.spec.command == ["/bin/sh", "-c", "true"]
    # Once it exists it is kept, whatever its state: a finished job is never started again.
    done = {"job": Observed("job", 7, State.SUCCEEDED)}
    assert reconcile(c.units(spec(), done, 1.0), done) == ([], [])


def test_reconcile_adds_missing_units_and_cancels_unwanted_live_ones():
    s = spec()
    observed = {"replica-0": Observed("replica-0", 1, State.RUNNING),
                "replica-1": Observed("replica-1", 2, State.RUNNING),
                "replica-2": Observed("replica-2", 3, State.FAILED)}
    wanted = [Unit("replica-0", s), Unit("replica-3", s)]
    add, drop = reconcile(wanted, observed)
    assert [u.name for u in add] == ["replica-3"] and drop == [2]  # 3 has ended already


def test_bad_units_are_one_line_errors():
    s = spec()
    with pytest.raises(SpecError, match=r"names must be unique"):
        reconcile([Unit("a", s), Unit("a", s)], {})
    with pytest.raises(SpecError, match=r"units\[leaf-0\]\.colocate_with: .*'root'"):
        reconcile([Unit("leaf-0", s, colocate_with="root")], {})


def test_kinds_the_control_plane_does_not_run_yet_name_their_command():
    svc = load_spec("examples/serve/service.yaml")
    with pytest.raises(SpecError, match=r"^kind: the control plane does not run Service specs yet; use `plinth serve"):
        controller_for(svc)
    assert "Job" in CONTROLLERS.names()

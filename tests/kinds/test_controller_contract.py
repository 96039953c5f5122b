"""One contract suite for every kind's controller (`plinth.core.kinds.Controller`): each kind
the control plane registers is driven here through the whole contract, outside the control
plane, with nothing but a `LocalContext` (a folder, a capacity, a clock)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from plinth.control.kinds import CONTROLLERS
from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec
from plinth.core.kinds import (
    BaseController,
    Capacity,
    Controller,
    LocalContext,
    Observed,
    Workload,
    reconcile,
)
from plinth.core.lifecycle import State
from plinth.core.spec import load_spec

TESTS = Path(__file__).parents[1]


def _service(tmp: Path) -> Workload:
    (tmp / "svc.yaml").write_text("kind: Service\nname: svc\nmodel: mlp\nslo_ms: 100\n"
                                  "service_ms: 10\nmax_replicas: 4\n")
    return Workload(1, "Service", "svc", "t", load_spec(tmp / "svc.yaml"), secret="s" * 32)


def _fl(tmp: Path) -> Workload:
    doc = yaml.safe_load((TESTS / "fl" / "apps" / "tiny.yaml").read_text())
    doc |= {"kind": "FLTask", "name": "digits", "code": str(TESTS / "fl" / "apps" / "tiny.py"),
            "transport": {"tokens": str(tmp / "tokens.txt")}}
    doc["server"]["aggregation"] = {"mode": "tree", "middles": 2}
    doc["data"]["clients"] = 4
    (tmp / "app.yaml").write_text(yaml.safe_dump(doc))
    subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "tokens",
                    str(tmp / "tokens.txt"), "--clients", "4"], check=True, capture_output=True)
    return Workload(1, "FLTask", "digits", "t", load_spec(tmp / "app.yaml"))


def _tune(tmp: Path) -> Workload:
    (tmp / "tune.yaml").write_text("kind: Tune\nname: tiny\nmodel: plinth.tune.models:tiny_linear\n"
                                   "input_shape: [1, 64]\ntarget: cpu\nshares: [1, 2]\n"
                                   "trials: 8\nservers: 1\nclients: 1\n")
    return Workload(1, "Tune", "tiny", "t", load_spec(tmp / "tune.yaml"))


SAMPLES = {"Service": _service, "FLTask": _fl, "Tune": _tune}


@pytest.fixture(params=sorted(SAMPLES))
def kind(request) -> str:
    return request.param


@pytest.fixture
def ctl(kind):
    c = CONTROLLERS.make(kind)
    yield c
    c.close()


def test_every_registered_kind_is_in_this_suite():
    assert set(CONTROLLERS.names()) == set(SAMPLES)


def test_it_implements_the_whole_contract_with_its_signatures(kind, ctl):
    assert isinstance(ctl, BaseController) and ctl.kind == kind
    for name, want in inspect.getmembers(Controller, inspect.isfunction):
        if name.startswith("_"):
            continue
        got = getattr(type(ctl), name)
        assert list(inspect.signature(got).parameters) == \
            list(inspect.signature(want).parameters), name


def test_it_depends_on_core_only(kind):
    """Its module imports nothing of the control plane (the import contracts hold it too)."""
    module = sys.modules[type(CONTROLLERS.make(kind)).__module__]
    text = Path(module.__file__).read_text()
    assert "plinth.control" not in text.replace("plinth.control.", "").split('"""', 2)[-1]


def test_a_workload_lives_through_the_contract(kind, ctl, tmp_path):
    w = SAMPLES[kind](tmp_path)
    ctx = LocalContext(tmp_path / "plane")
    ctl.check(w, ctx)
    ctl.start(w, ctx)
    json.dumps(w.status)  # the status is stored as JSON

    first = ctl.units(w, {}, 0.0)
    names = [u.name for u in first]
    assert first and len(names) == len(set(names)), names
    assert all(isinstance(u.spec, JobSpec) for u in first)
    assert first == ctl.units(w, {}, 99.0)  # a function of the workload, not of the clock
    add, drop = reconcile(first, {}, ["n0", "n1", "n2", "n3"])
    assert drop == [] and {u.name for u in add} <= set(names)

    observed = {n: Observed(n, i + 1, State.RUNNING, f"n{i % 2}") for i, n in enumerate(names)}
    assert ctl.finished(w, observed) is None  # nothing has ended
    for n in names:
        model = ctl.report_model(w, n)
        assert model is None or issubclass(model, BaseModel), (n, model)
    ctx.t = 5.0
    assert set(map(id, ctl.tick([w], ctx))) <= {id(w)}
    ctl.unit_ended(w, names[-1], ctx)
    json.dumps(w.status)
    ctl.end(w, ctx)


def test_after_a_restart_it_starts_again_from_its_status(kind, tmp_path):
    w = SAMPLES[kind](tmp_path)
    ctl = CONTROLLERS.make(kind)
    try:
        ctl.start(w, LocalContext(tmp_path / "plane"))
        before = ctl.units(w, {}, 0.0)
    finally:
        ctl.close()  # the control plane stops
    again = CONTROLLERS.make(kind)
    try:
        w2 = Workload(w.id, w.kind, w.name, w.tenant, w.spec, json.loads(json.dumps(w.status)),
                      w.secret)
        again.start(w2, LocalContext(tmp_path / "plane", recovered=True))
        assert [u.name for u in again.units(w2, {}, 0.0)] == [u.name for u in before]
    finally:
        again.close()


def test_it_refuses_a_workload_the_cluster_can_never_hold_in_one_line(kind, ctl, tmp_path):
    w = SAMPLES[kind](tmp_path)
    with pytest.raises(SpecError) as e:
        ctl.check(w, LocalContext(tmp_path, Capacity(cpus=0.5, gpus=0, nodes=1)))
    assert "\n" not in str(e.value) and ":" in str(e.value)

"""An FL task's addresses as its controller keeps them (`plinth.fl.workload`), driven outside the
control plane: each unit reports the address it bound on its node; what connects to a unit is
started only once that is known, with it; an address is forgotten once its unit stops; a unit
started with an address its parent no longer has is stopped and started again with the new
one. Nothing is picked on the control plane's host."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from plinth.core.kinds import LocalContext, Observed, Workload, reconcile
from plinth.core.lifecycle import State
from plinth.fl.app import load_app
from plinth.fl.transport.certs import write_tokens
from plinth.fl.workload import FLTaskController, client_address

APPS = Path(__file__).parent / "apps"
NODES = ("a", "b")


@pytest.fixture
def task(tmp_path):
    """A tree-mode task with 2 middles (one leaf each), its controller and a context."""
    write_tokens(tmp_path / "tokens.txt", [str(i) for i in range(4)])
    doc = yaml.safe_load((APPS / "tiny.yaml").read_text())
    doc |= {"kind": "FLTask", "name": "t", "code": str(APPS / "tiny.py"),
            "transport": {"tokens": "tokens.txt"}}
    doc["data"]["clients"] = 4
    doc["server"]["aggregation"] = {"mode": "tree", "max_leaves": 1, "middles": 2}
    (tmp_path / "app.yaml").write_text(yaml.safe_dump(doc))
    ctl, ctx = FLTaskController(), LocalContext(tmp_path / "plane")
    w = Workload(1, "FLTask", "t", "default", load_app(str(tmp_path / "app.yaml")))
    ctl.start(w, ctx)
    return ctl, w, ctx


def _argv(units, name: str) -> list[str]:
    (u,) = [u for u in units if u.name == name]
    return list(u.spec.command)


def _report(ctl, w, ctx, unit: str, address: str, leaf: str = "127.0.0.1:7000") -> None:
    ctl.report(w, unit, ctl.report_model(w, unit)(address=address, leaf_address=leaf), ctx)


def _run(observed: dict, *names: str, job: int | None = None) -> None:
    for n in names:
        node = "b" if n.startswith("middle-1") else "a"
        observed[n] = Observed(n, job or 10 + len(observed), State.RUNNING, node)


def test_what_connects_to_a_unit_starts_once_it_has_reported_where_it_listens(task):
    ctl, w, ctx = task
    assert "address" not in w.status and "host" not in vars(ctl)  # none picked by the plane
    observed: dict[str, Observed] = {}
    assert [u.name for u in ctl.units(w, observed, 0)] == ["server"]
    _run(observed, "server")
    assert [u.name for u in ctl.units(w, observed, 0)] == ["server"]  # not reported yet
    _report(ctl, w, ctx, "server", "198.18.0.2:40001")
    units = ctl.units(w, observed, 0)
    assert [u.name for u in units] == ["server", "middle-0", "middle-1"]
    for m in ("middle-0", "middle-1"):
        argv = _argv(units, m)
        assert argv[argv.index("--server") + 1] == "198.18.0.2:40001"
        assert "--address" not in argv  # it listens on its own node's address
    assert client_address(w.status, 0) is None  # clients join their middle: not known yet
    _run(observed, "middle-0", "middle-1")
    _report(ctl, w, ctx, "middle-0", "198.18.0.2:40002", "127.0.0.1:7002")
    units = ctl.units(w, observed, 0)
    assert [u.name for u in units] == ["server", "middle-0", "middle-0.leaf-0", "middle-1"]
    argv = _argv(units, "middle-0.leaf-0")
    assert argv[argv.index("--connect") + 1] == "127.0.0.1:7002"
    assert (client_address(w.status, 2), client_address(w.status, 1)) == \
        ("198.18.0.2:40002", None)
    add, drop = reconcile(units, observed, NODES)
    assert [u.name for u in add] == ["middle-0.leaf-0"] and drop == []


def test_a_server_started_again_elsewhere_has_its_middles_follow_it(task):
    ctl, w, ctx = task
    observed: dict[str, Observed] = {}
    _run(observed, "server", job=1)
    _report(ctl, w, ctx, "server", "198.18.0.2:40001")
    ctl.units(w, observed, 0)
    _run(observed, "middle-0", "middle-1")
    _report(ctl, w, ctx, "middle-0", "198.18.0.2:40002")
    ctl.units(w, observed, 0)
    _run(observed, "middle-0.leaf-0")
    # its node is lost: the server's job is requeued, and its address forgotten; the middles
    # stay up (as clients, they wait for it)
    observed["server"] = Observed("server", 1, State.PENDING)
    units = ctl.units(w, observed, 1)
    assert "address" not in w.status and client_address(w.status, 0) == "198.18.0.2:40002"
    assert reconcile(units, observed, NODES) == ([], [])
    # it runs again on b, on another port, and says so: the middles are stopped (a middle's
    # leaf with it) ...
    observed["server"] = Observed("server", 1, State.RUNNING, "b")
    _report(ctl, w, ctx, "server", "198.18.0.3:40007")
    add, drop = reconcile(ctl.units(w, observed, 2), observed, NODES)
    assert add == [] and sorted(drop) == sorted(observed[m].job_id for m in
                                                ("middle-0", "middle-1", "middle-0.leaf-0"))
    # ... and once they have ended, started again with its new address
    for m in ("middle-0", "middle-1", "middle-0.leaf-0"):
        observed[m] = Observed(m, observed[m].job_id, State.CANCELLED, observed[m].node)
    add, drop = reconcile(ctl.units(w, observed, 3), observed, NODES)
    assert [u.name for u in add] == ["middle-0"] and drop == []  # apart: one node at a time
    argv = list(add[0].spec.command)
    assert argv[argv.index("--server") + 1] == "198.18.0.3:40007"


def test_a_bad_address_in_a_report_is_refused_naming_the_field(task):
    ctl, w, _ = task
    model = ctl.report_model(w, "server")
    with pytest.raises(ValueError, match="address"):
        model.model_validate({"address": "0.0.0.0"})
    with pytest.raises(ValueError, match="leaf_address"):
        model.model_validate({"leaf_address": "127.0.0.1:99999"})

"""Workload kinds: controllers say which units a workload needs; reconcile diffs them."""

from __future__ import annotations

import pytest

from plinth.control.kinds import CONTROLLERS, check_kind
from plinth.core.kinds import Observed, Unit, reconcile
from plinth.core.jobspec import JobSpec
from plinth.core.errors import SpecError
from plinth.core.spec import load_spec
from plinth.core.lifecycle import State


def spec(**kw) -> JobSpec:
    return JobSpec.model_validate({"command": "true", **kw})


def test_a_unit_that_ended_is_replaced_while_it_is_wanted():
    s = spec()
    observed = {"replica-0": Observed("replica-0", 1, State.FAILED)}
    add, drop = reconcile([Unit("replica-0", s)], observed)
    assert [u.name for u in add] == ["replica-0"] and drop == []
    assert reconcile([], observed) == ([], [])  # not wanted, and already ended: nothing to do


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
    with pytest.raises(SpecError, match=r"units\[leaf-0\]\.colocate_with: 'root' is not "
                                        r"another unit"):
        reconcile([Unit("leaf-0", s, colocate_with="root")], {})


def test_a_colocated_unit_waits_for_its_partner_then_is_pinned_to_its_node() -> None:
    s = spec()
    server, leaf = Unit("server", s), Unit("leaf-0", s, colocate_with="server")
    add, drop = reconcile([server, leaf], {})
    assert [u.name for u in add] == ["server"] and not drop  # the leaf waits
    pending = {"server": Observed("server", 1, State.PENDING)}
    assert [u.name for u in reconcile([server, leaf], pending)[0]] == []
    running = {"server": Observed("server", 1, State.RUNNING, node="n1")}
    (pinned,), _ = reconcile([server, leaf], running)
    assert pinned.name == "leaf-0" and pinned.spec.nodelist == ["n1"]
    assert pinned.spec.request().nodes == ("n1",)
    moved = {"server": Observed("server", 3, State.RUNNING, node="n2"),
             "leaf-0": Observed("leaf-0", 2, State.RUNNING, node="n1")}
    assert reconcile([server, leaf], moved) == ([], [2])  # off its partner's node: replaced


def test_units_kept_apart_go_one_at_a_time_each_to_a_node_the_others_are_not_on() -> None:
    s = spec()
    nodes = ["n1", "n2", "n3"]
    a, b = Unit("middle-0", s, apart_from=("middle-1",)), Unit("middle-1", s,
                                                               apart_from=("middle-0",))
    (first,), _ = reconcile([a, b], {}, nodes)  # the first listed goes first, anywhere
    assert first.name == "middle-0" and first.spec.nodelist == nodes
    pending = {"middle-0": Observed("middle-0", 1, State.PENDING)}
    assert reconcile([a, b], pending, nodes) == ([], [])  # not while it is being placed
    placed = {"middle-0": Observed("middle-0", 1, State.RUNNING, node="n2")}
    (second,), _ = reconcile([a, b], placed, nodes)
    assert second.name == "middle-1" and second.spec.nodelist == ["n1", "n3"]
    # the first is replaced after the second was placed: it keeps off the second's node
    lost = {"middle-0": Observed("middle-0", 1, State.FAILED),
            "middle-1": Observed("middle-1", 2, State.RUNNING, node="n1")}
    (again,), _ = reconcile([a, b], lost, nodes)
    assert again.name == "middle-0" and again.spec.nodelist == ["n2", "n3"]
    # no node left for it: it waits (the controller refuses such a task when it is submitted)
    assert reconcile([a, b], placed, ["n2"]) == ([], [])
    with pytest.raises(SpecError, match=r"units\[middle-0\]\.apart_from: 'm' is not"):
        reconcile([Unit("middle-0", s, apart_from=("m",))], {}, nodes)


def test_kinds_the_control_plane_does_not_run_name_their_command():
    cluster = load_spec("examples/cluster.yaml")
    with pytest.raises(SpecError, match=r"^kind: the control plane does not run Cluster specs "
                                        r"yet; use `plinth sim"):
        check_kind(cluster)
    assert check_kind(load_spec("examples/serve/service.yaml")) == "Service"
    assert check_kind(load_spec("examples/fl/mnist/grpc.yaml")) == "FLTask"
    assert check_kind(spec()) == "Job" and {"Service", "FLTask"} <= set(CONTROLLERS.names())

"""The Tune controller's units and the pure planning under it (no TVM, no processes)."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from plinth.core.errors import SpecError
from plinth.core.kinds import Capacity, LocalContext, Observed, Workload, WorkloadState, reconcile
from plinth.core.lifecycle import State
from plinth.tune.controller import TuneController
from plinth.tune.db import model_key
from plinth.tune.model import Task
from plinth.tune.plan import budget, parse_shard, shard, share_key
from plinth.tune.reports import Bound, Tuned
from plinth.tune.spec import TuneSpec

CTX = LocalContext(Path("/nonexistent"))
TRACKER = "10.0.0.1:9190"


def _spec(**kw) -> TuneSpec:
    # model_construct: these tests are about units, not about importing a model through TVM
    base = {name: f.default for name, f in TuneSpec.model_fields.items()}
    base.update(model="plinth.tune.models:tiny_linear", input_shape=[1, 64], shares=[1, 2],
                trials=8, servers=2, clients=2, name="t")
    base.update(kw)
    return TuneSpec.model_construct(**base)


def _w(spec: TuneSpec) -> Workload:
    return Workload(1, "Tune", spec.name, "t", spec)


def _obs(names, state=State.RUNNING):
    """Each unit with a job of its own (the same id for the same name), in its first attempt."""
    return {n: Observed(n, zlib.crc32(n.encode()), state, attempt=1) for n in names}


def _bound(ctl, w, observed, unit, address) -> bool:
    """`unit` reports the address it bound, from the attempt of its job that `observed` has."""
    o = observed[unit]
    return ctl.report(w, unit, Bound(address=address, job=o.job_id, attempt=o.attempt), CTX)


def _started(ctl, w):
    """Every unit running: the tracker first, which reports its address; then the servers it
    lets start, which report theirs; then the clients they let start."""
    observed = _obs([u.name for u in ctl.units(w, {}, 0.0)])
    _bound(ctl, w, observed, "tracker", TRACKER)
    observed = _obs([u.name for u in ctl.units(w, observed, 0.0)])
    for i, n in enumerate(n for n in observed if n.startswith("server-")):
        _bound(ctl, w, observed, n, f"10.0.1.{i}:9000")
    return _obs([u.name for u in ctl.units(w, observed, 0.0)])


def test_units_are_tracker_servers_and_clients_per_share():
    ctl, w = TuneController(), _w(_spec())
    names = list(_started(ctl, w))
    assert names[0] == "tracker"
    assert sorted(names[1:]) == sorted(
        [f"server-share-{s}-{j}" for s in (1, 2) for j in (0, 1)]
        + [f"client-share-{s}-{i}" for s in (1, 2) for i in (0, 1)])
    units = {u.name: u.spec for u in ctl.units(w, _started(ctl, w), 0.0)}
    server = units["server-share-2-0"]
    assert server.resources.cpus == 2 and server.command[-2:] == ["--threads", "2"]
    assert "--key" in server.command and "share-2" in server.command
    client = units["client-share-1-1"]
    assert client.command[client.command.index("--shard") + 1] == "1/2"
    for unit in (server, client):  # the address the tracker reported, from its own node
        assert unit.command[unit.command.index("--tracker") + 1] == TRACKER


def test_nothing_but_the_tracker_starts_before_it_reports_where_it_listens():
    ctl, w = TuneController(), _w(_spec())
    assert [u.name for u in ctl.units(w, {}, 0.0)] == ["tracker"]
    observed = _obs(["tracker"], State.PENDING)
    assert [u.name for u in ctl.units(w, observed, 1.0)] == ["tracker"]
    observed = _obs(["tracker"])
    assert [u.name for u in ctl.units(w, observed, 1.0)] == ["tracker"]  # runs, not bound yet
    assert _bound(ctl, w, observed, "tracker", TRACKER)
    assert not _bound(ctl, w, observed, "tracker", TRACKER)  # the same again changes nothing
    assert w.status["addresses"]["tracker"]["address"] == TRACKER
    names = [u.name for u in ctl.units(w, observed, 2.0)]
    assert names[0] == "tracker" and sorted(names[1:]) == sorted(
        f"server-share-{s}-{j}" for s in (1, 2) for j in (0, 1))


def test_clients_start_once_a_server_of_their_share_reports_and_keep_it_replaced():
    ctl, w = TuneController(), _w(_spec())
    tracker = _obs(["tracker"])
    _bound(ctl, w, tracker, "tracker", TRACKER)
    first = [u.name for u in ctl.units(w, tracker, 0.0)]
    assert first[0] == "tracker" and not any(n.startswith("client") for n in first)
    # share 1's servers placed, share 2's still queued (the machine is full): only share 1's
    # clients start, so that share 2's do not spend their trials waiting at the tracker
    observed = {**_obs(first, State.PENDING), **tracker}
    observed["server-share-1-1"] = Observed("server-share-1-1", 3, State.RUNNING, attempt=1)
    assert not any(u.name.startswith("client") for u in ctl.units(w, observed, 1.0))
    _bound(ctl, w, observed, "server-share-1-1", "10.0.0.2:9091")  # it listens
    names = [u.name for u in ctl.units(w, observed, 1.0)]
    assert {n for n in names if n.startswith("client")} == {"client-share-1-0",
                                                            "client-share-1-1"}
    # a started client stays wanted while its share's only server is replaced
    for i, n in enumerate(n for n in names if n.startswith("client")):
        observed[n] = Observed(n, 20 + i, State.RUNNING)
    for j in (0, 1):
        observed[f"server-share-1-{j}"] = Observed(f"server-share-1-{j}", 10 + j, State.FAILED)
    add, drop = reconcile(ctl.units(w, observed, 2.0), observed)
    assert sorted(u.name for u in add) == ["server-share-1-0", "server-share-1-1"]
    assert drop == []


def test_a_share_of_the_whole_machine_fits_beside_the_tracker():
    # A 2-core machine tuning at 1 and 2 cores: share 2's server (2 CPUs) waits for share 1's
    # to go, while the tracker lives until share 2's clients are done. Were the tracker to
    # hold any CPU, share 2 could never be placed.
    ctl, w = TuneController(), _w(_spec())
    units = {u.name: u.spec for u in ctl.units(w, _started(ctl, w), 0.0)}
    assert units["tracker"].resources.cpus + units["server-share-2-0"].resources.cpus <= 2


def test_gpu_servers_ask_for_a_fraction():
    ctl, w = TuneController(), _w(_spec(target="cuda", shares=[25, 50]))
    units = ctl.units(w, _started(ctl, w), 0.0)
    server = next(u for u in units if u.name == "server-share-25-0").spec
    assert server.resources.gpu_fraction == 0.25 and "--threads" not in server.command


def _end(w, observed, name, state):
    observed[name] = Observed(name, observed[name].job_id, state, attempt=1)
    TuneController().unit_ended(w, name, CTX)


def test_servers_go_when_their_share_is_done_and_the_tracker_last():
    ctl, w = TuneController(), _w(_spec())
    observed = _started(ctl, w)
    for c in ("client-share-1-0", "client-share-1-1"):
        _end(w, observed, c, State.SUCCEEDED)
    add, drop = reconcile(ctl.units(w, observed, 1.0), observed)
    assert add == [] and ctl.finished(w, observed) is None
    assert sorted(drop) == sorted(observed[f"server-share-1-{j}"].job_id for j in (0, 1))
    _end(w, observed, "client-share-2-0", State.SUCCEEDED)
    _end(w, observed, "client-share-2-1", State.FAILED)  # once: it runs again
    add, _ = reconcile(ctl.units(w, observed, 2.0), observed)
    assert [u.name for u in add] == ["client-share-2-1"]
    observed["client-share-2-1"] = Observed("client-share-2-1", 99, State.RUNNING)
    _end(w, observed, "client-share-2-1", State.FAILED)  # twice: it has given up
    assert ctl.units(w, observed, 3.0) == []
    assert ctl.finished(w, observed) is WorkloadState.FAILED


def test_a_dead_server_is_replaced_while_its_share_tunes():
    ctl, w = TuneController(), _w(_spec())
    observed = _started(ctl, w)
    observed["server-share-1-0"] = Observed("server-share-1-0", 1, State.FAILED)
    add, drop = reconcile(ctl.units(w, observed, 1.0), observed)
    assert [u.name for u in add] == ["server-share-1-0"] and drop == []


def test_a_tracker_that_ends_takes_its_address_and_its_servers_with_it():
    ctl, w = TuneController(), _w(_spec(servers=1, clients=1))
    observed = _started(ctl, w)
    servers = sorted(observed[f"server-share-{s}-0"].job_id for s in (1, 2))
    _end(w, observed, "tracker", State.FAILED)
    add, drop = reconcile(ctl.units(w, observed, 1.0), observed)
    # its replacement starts; the servers, which could not reach it, go; the clients that run
    # are left to end
    assert [u.name for u in add] == ["tracker"] and sorted(drop) == servers
    observed["tracker"] = Observed("tracker", 50, State.RUNNING, attempt=1)
    for s in (1, 2):
        _end(w, observed, f"server-share-{s}-0", State.CANCELLED)
    assert [u.name for u in ctl.units(w, observed, 2.0)] == [
        "tracker", "client-share-1-0", "client-share-2-0"]
    _bound(ctl, w, observed, "tracker", "10.0.0.3:9190")  # the new one: servers start again
    add, _ = reconcile(ctl.units(w, observed, 3.0), observed)
    assert [(u.name, u.spec.command[u.spec.command.index("--tracker") + 1]) for u in add] == [
        ("server-share-1-0", "10.0.0.3:9190"), ("server-share-2-0", "10.0.0.3:9190")]


def test_a_tracker_that_restarts_in_its_job_is_not_current_until_it_reports_again():
    ctl, w = TuneController(), _w(_spec(servers=1, clients=1))
    observed = _started(ctl, w)
    job = observed["tracker"].job_id
    observed["tracker"] = Observed("tracker", job, State.PENDING, attempt=1)  # requeued
    assert [u.name for u in ctl.units(w, observed, 1.0)] == [
        "tracker", "client-share-1-0", "client-share-2-0"]
    observed["tracker"] = Observed("tracker", job, State.RUNNING, attempt=2)
    assert not any(u.name.startswith("server") for u in ctl.units(w, observed, 2.0))
    _bound(ctl, w, observed, "tracker", "10.0.0.4:9190")
    assert w.status["addresses"]["tracker"] == {"address": "10.0.0.4:9190", "job": job,
                                                "attempt": 2}
    assert sum(u.name.startswith("server") for u in ctl.units(w, observed, 3.0)) == 2


def test_what_units_report_and_what_the_controller_keeps():
    ctl, w = TuneController(), _w(_spec())
    assert ctl.report_model(w, "tracker") is Bound
    assert ctl.report_model(w, "server-share-2-1") is Bound
    assert ctl.report_model(w, "client-share-1-0") is Tuned
    assert ctl.report_model(w, "server-share-3-0") is None  # no such share
    assert ctl.report(w, "client-share-1-0", Tuned(tasks=1, trials=4, records=3, seconds=9.5),
                      CTX)
    assert w.status["results"] == {"client-share-1-0": {"tasks": 1, "trials": 4, "records": 3,
                                                        "seconds": 9.5}}


@pytest.mark.parametrize("address", ["nowhere", "10.0.0.1:0", "10.0.0.1:99999", ":9190"])
def test_an_address_that_is_not_host_port_is_refused(address):
    with pytest.raises(ValueError, match="address") as e:
        Bound.model_validate({"address": address, "job": 1, "attempt": 1})
    assert "HOST:PORT" in str(e.value)


def test_check_refuses_shares_the_cluster_cannot_hold(tmp_path):
    with pytest.raises(SpecError, match="shares: 2 cores is more than the cluster's 1 CPUs"):
        TuneController().check(_w(_spec()), LocalContext(tmp_path, Capacity(1.0, 0, 1)))
    with pytest.raises(SpecError, match="target: cuda, but the cluster has no GPU"):
        TuneController().check(_w(_spec(target="cuda", shares=[50])),
                               LocalContext(tmp_path, Capacity(16.0, 0, 1)))


def test_the_controller_is_pure():
    ctl, w = TuneController(), _w(_spec())
    assert ctl.units(w, {}, 0.0) == ctl.units(w, {}, 99.0)
    assert ctl.units(w, _started(ctl, w), 0.0) == ctl.units(w, _started(ctl, w), 99.0)


def test_shards_balance_task_counts_spread_heavy_tasks_and_cover_each_once():
    tasks = [Task(f"t{i}", w, f) for i, (w, f) in
             enumerate([(1, 100.0), (2, 10.0), (1, 90.0), (1, 5.0), (3, 1.0)])]
    parts = shard(tasks, 2)
    assert sorted(i for p in parts for i in p) == list(range(5))
    assert sorted(len(p) for p in parts) == [2, 3]
    assert (0 in parts[0]) != (2 in parts[0])  # the two heaviest go to different clients
    assert parts == shard(tasks, 2)
    assert shard(tasks, 7)[6] == []  # more clients than tasks: idle ones
    with pytest.raises(ValueError):
        shard(tasks, 0)


def test_budget_and_keys():
    assert budget(64, 2, 4) == 32 and budget(3, 2, 8) == 2 and budget(10, 0, 3) == 0
    assert parse_shard("1/4") == (1, 4)
    with pytest.raises(ValueError, match="0 <= I < K"):
        parse_shard("4/4")
    assert share_key(2.0) == "share-2" and share_key(12.5) == "share-12.5"
    assert model_key("plinth.tune.models:small_cnn", [1, 3, 32, 32]) == \
        "plinth.tune.models-small_cnn-1x3x32x32"

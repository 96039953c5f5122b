"""An FL task with LIFL's per-node level on a 2-node platform: `server.aggregation.middles: 2`
makes two middle aggregator units, each on a node of its own, each with its leaf units on its
node; 4 real client processes join the middle of their cid over gRPC; the server folds one
update per node each round, and the task ends with every round done and the accuracy of a
flat run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from plinth_platform import with_shims
from plinth_platform import run_cli as cli
from test_fl_tasks import app, start_client, task_platform
from test_fl_tree_task import jobs_dir
from virtual import VirtualPlatform
from virtual_http import served

from plinth.core.kinds import LocalContext, Observed, Workload, reconcile
from plinth.core.errors import SpecError
from plinth.core.spec import load_spec
from plinth.fl.app import parse_app
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.workload import FLTaskController
from plinth.core.lifecycle import State

ROUNDS, CLIENTS, MIDDLES = 6, 4, 2


def run_middle_task(tmp_path: Path, wait_for, *extra: str, fake_gpus: str | None,
                    kill: bool = False) -> dict:
    """A task with 2 middles on `plinth up *extra` (a cluster of at least 2 nodes): checks that
    the middles ran on two nodes, each with its leaves, that the server folded one update a node
    each round, and that the task ended accurately; returns the node of each unit. With `kill`,
    middle-1 is killed (-9) after round 2: it is started again, its clients and the server take
    it back, and only the rounds it missed, if any, lack its update (a round that asked it while
    it was down waits for the server's straggler timeout, then counts it as a failure)."""
    spec = app(tmp_path, clients=CLIENTS)
    doc = yaml.safe_load(spec.read_text())
    rounds = 4 * ROUNDS if kill else ROUNDS  # the kill lands mid-task
    if kill:  # how long the round a middle dies in waits for it (30 s once cut round 1,
        doc["server"]["straggler_timeout"] = 60  # its leaves still starting, on a busy CI)
    doc["server"] |= {"rounds": rounds, "aggregation": {"mode": "tree", "max_leaves": 1,
                                                         "middles": MIDDLES}}
    # on two fake nodes (one per GPU model), each with half of this machine's 2 CPUs: a node
    # for each middle (0.5 CPU) and its leaf (0.25), and the server (0.25) beside one of them
    doc["resources"]["cpus"] = 0.25
    spec.write_text(yaml.safe_dump(doc))
    with task_platform(tmp_path, spec, *extra, clients=0, fake_gpus=fake_gpus) as (p, clients):
        c = p.client()
        assert [m["clients"] for m in c.workload("digits-fl")["status"]["middles"]] == [2, 2]
        # each client asks the control plane for its middle's address, once it is reported
        clients += [start_client(spec, p, cid) for cid in range(CLIENTS)]

        def reported() -> list[dict] | None:
            ms = c.workload("digits-fl")["status"]["middles"]
            return ms if all(m.get("address") for m in ms) else None

        middles = wait_for(reported, 180, "the middles to report their addresses")
        shown = cli(p, "show", "digits-fl")
        assert shown.returncode == 0, shown.stderr
        for m in middles:
            assert re.search(rf"{m['name']}: clients with cid mod 2 = \d \(2\) connect to "
                             rf"{m['address']}", shown.stdout), shown.stdout

        def node_of(job_id: int) -> str | None:
            alloc = c.job(job_id)["allocation"]
            return alloc["slots"][0]["node_name"] if alloc else None

        placed: dict[str, str] = {}

        def all_placed() -> bool:
            for u in c.workload("digits-fl")["units"]:
                if u["state"] == "running" and (node := node_of(u["job_id"])):
                    placed[u["unit"]] = node
            return {"middle-0", "middle-1", "middle-0.leaf-0", "middle-1.leaf-0"} <= set(placed)

        wait_for(all_placed, 180, "the middles and a leaf of each to run")
        assert placed["middle-0"] != placed["middle-1"], placed  # one a node
        for unit, node in placed.items():
            if ".leaf-" in unit:  # a middle's leaves share its node
                assert node == placed[unit.split(".")[0]], placed
        assert not any(u.startswith("leaf-") for u in placed), placed  # the server has none
        if kill:
            wait_for(lambda: c.workload("digits-fl")["status"]["round"] >= 2, 180, "2 rounds")
            (unit,) = [u for u in c.workload("digits-fl")["units"] if u["unit"] == "middle-1"]
            victims = with_shims([x for x in psutil.process_iter(["environ"])
                                  if (x.info["environ"] or {}).get("PLINTH_JOB_ID")
                                  == str(unit["job_id"])])
            assert victims, unit
            for x in victims:
                x.kill()
            assert c.workload("digits-fl")["status"]["round"] < rounds - 2
            # lost with its process, it is started again (the same unit job's next attempt)
            wait_for(lambda: c.job(unit["job_id"])["attempt"] >= 2
                     and c.job(unit["job_id"])["state"] == "running", 120,
                     "middle-1 to be started again")
        wait_for(lambda: c.workload("digits-fl")["state"] != "active", 300, "the task to end")
        done = c.workload("digits-fl")
        assert done["state"] == "succeeded", done
        per_round = done["status"]["per_round"]
        assert [r["round"] for r in per_round] == list(range(1, rounds + 1))
        # a flat run of this app (`plinth fl sim`, 4 clients, 6 rounds) ends above 0.85
        assert per_round[-1]["accuracy"] > 0.8, per_round
        (folder,) = jobs_dir(p).glob("*/workload-*/server")
        records = Checkpointer(folder).latest().records
        for r in records:  # one update a node reached the server, from the middles only
            assert set(r["clients"]) <= {"middle-0", "middle-1"}, r
            assert r["updates"] + len(r["failures"]) == len(r["clients"]), r  # none vanished
            assert r["updates"] == MIDDLES or kill and r["round"] > 2, r
            # a round misses only the killed middle, and only when it asked while that middle
            # was down (a restart quick enough to rejoin within the round misses none)
            assert {f["cid"] for f in r["failures"]} <= ({"middle-1"} if kill else set()), r
        assert records[-1]["updates"] == MIDDLES, records[-1]  # the replaced middle is back
        for m in middles:  # and each middle folded its clients' updates through its leaves
            (shape,) = jobs_dir(p).glob(f"*/workload-*/{m['name']}/tree.json")
            tree = yaml.safe_load(shape.read_text())
            assert tree["round"] == rounds and tree["leaves"] >= 1, tree
            assert done["status"]["leaves"][m["name"]] >= 1  # as the middle reported it
        return placed


@pytest.mark.slow
def test_middles_are_units_one_a_node_with_their_leaves_and_the_server_folds_one_a_node(
        tmp_path, wait_for):
    run_middle_task(tmp_path, wait_for, fake_gpus="2xA100,2xV100")


@pytest.mark.slow
def test_a_killed_middle_is_replaced_and_its_node_rejoins_the_task(tmp_path, wait_for):
    run_middle_task(tmp_path, wait_for, fake_gpus="2xA100,2xV100", kill=True)


def test_middles_that_cannot_each_have_a_node_or_that_skip_consent_are_refused(tmp_path):
    spec = app(tmp_path, clients=CLIENTS)
    doc = yaml.safe_load(spec.read_text())
    doc["server"] |= {"aggregation": {"mode": "tree", "middles": 3}}
    spec.write_text(yaml.safe_dump(doc))
    # a control plane in virtual time on two nodes (virtual.py), the CLI over real HTTP
    with VirtualPlatform(tmp_path, cluster="1x2xA100,1x2xV100") as vp, served(vp) as api:
        out = cli(api, "submit", str(spec))
        assert out.returncode != 0
        assert "server.aggregation.middles: 3 middle aggregators need a node each, and the " \
               "cluster has 2" in out.stderr, out.stderr
        assert vp.client().workloads(all=True) == []  # nothing of it was kept
    # as a flat app by hand, the server says who starts middles
    doc["server"]["aggregation"]["middles"] = 1
    spec.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "server",
                          str(spec), "--no-tokens"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "only an FLTask's controller starts middle " \
        "aggregators" in out.stderr, out.stderr
    with pytest.raises(SpecError, match=r"server.aggregation.middles: consent is checked"):
        parse_app({**doc, "consent": {"registry": "consent.db", "purpose": "research"}},
                  base_dir=str(tmp_path))
    with pytest.raises(SpecError, match=r"middles: middle aggregators are part of the tree"):
        parse_app({**doc, "server": {**doc["server"], "aggregation": {"middles": 2}}},
                  base_dir=str(tmp_path))


def test_after_the_last_round_no_unit_that_ended_is_started_again(tmp_path):
    """A middle's leaf exits when its middle closes at the end of the task, a moment before
    the middle itself is seen to end: it is not replaced, and nothing still up is cancelled."""
    spec = app(tmp_path, clients=CLIENTS)
    doc = yaml.safe_load(spec.read_text())
    doc["server"] |= {"rounds": ROUNDS, "aggregation": {"mode": "tree", "middles": MIDDLES}}
    spec.write_text(yaml.safe_dump(doc))
    ctl = FLTaskController()
    w = Workload(1, "FLTask", "digits-fl", "default", load_spec(spec))
    ctx = LocalContext(tmp_path / "w")
    ctl.start(w, ctx)
    node = {"server": "a", "middle-0": "a", "middle-1": "b"}
    observed: dict[str, Observed] = {}
    for unit in ("server", "middle-0", "middle-1"):  # each runs, and reports where it listens
        assert unit in [u.name for u in ctl.units(w, observed, 0.0)]
        observed[unit] = Observed(unit, len(observed) + 1, State.RUNNING, node[unit])
        ctl.report(w, unit, ctl.report_model(w, unit)(
            address=f"10.0.0.{len(observed)}:4000", leaf_address="127.0.0.1:5000"), ctx)
    names = [u.name for u in ctl.units(w, observed, 0.0)]
    observed = {n: observed.get(n) or Observed(n, i + 10, State.RUNNING, node[n.split(".")[0]])
                for i, n in enumerate(names)}
    observed["middle-0.leaf-0"] = Observed("middle-0.leaf-0", 99, State.SUCCEEDED, "a")
    # (its middle closed it)
    mid_task = reconcile(ctl.units(w, observed, 1.0), observed, ("a", "b"))
    assert [u.name for u in mid_task[0]] == ["middle-0.leaf-0"], mid_task  # replaced mid-task
    w.status["round"] = ROUNDS  # the controller has read the last round
    assert reconcile(ctl.units(w, observed, 2.0), observed, ("a", "b")) == ([], [])

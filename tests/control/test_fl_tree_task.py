"""An FL task in tree mode with 10 real client processes on loopback: its leaf aggregators are
the task's units, seen in `plinth ls`, and resized between rounds as the clients that take part
grow from 3 to 10; the control plane is killed (-9) mid-round, then one leaf aggregator is
killed (-9) while it holds updates of that round; the round closes with those updates counted
as failures, the leaf unit is replaced, and the task finishes every round once, accurately."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import psutil
import pytest
import yaml
from plinth_platform import Platform
from plinth_platform import run_cli as cli
from test_fl_tasks import app, start_client, task_platform

from plinth.fl.checkpoint import Checkpointer

ROUNDS = 25
CLIENTS, FIRST = 10, 3  # 3 clients take part in the first rounds, then all 10
PER_LEAF = 4  # max_updates_per_leaf: 3 clients -> 1 leaf, 10 clients -> 3 leaves
LEAVES = 3  # and one warm spare unit


def leaf_units_listed(p: Platform) -> list[str]:
    """The task's leaf aggregator jobs that `plinth ls` lists (pending, running, stopping)."""
    out = cli(p, "ls")
    assert out.returncode == 0, out.stderr
    return sorted(set(re.findall(r"digits-fl\.(leaf-\d+)", out.stdout)))


def sockets() -> list[tuple[int, int, int, int]]:
    """This machine's TCP sockets as the kernel counts them (/proc/net/tcp, tcp6): local port,
    remote port, state (1: established) and bytes received but not yet read."""
    out = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16),
                        int(f[3], 16), int(f[4].split(":")[1], 16)))
    return out


def joined(port: int) -> int:
    """Connections made to `port` (by clients or leaves) that are established now."""
    return sum(remote == port and state == 1 for _, remote, state, _ in sockets())


def unread_bytes(local_port: int) -> int:
    """Bytes waiting in the socket on `local_port`: a stopped leaf with bytes waiting has been
    handed this round's updates (or told to finish it, after being handed some) and not
    answered."""
    return sum(unread for port, _, _, unread in sockets() if port == local_port)


def jobs_dir(p: Platform) -> Path:
    """Where the platform's tenants' jobs and workloads keep their files (--jobs-dir)."""
    return p.jobs_dir


@pytest.mark.slow
def test_a_tree_task_resizes_its_leaf_units_and_survives_its_control_plane_and_a_leaf(
        tmp_path, wait_for):
    spec = app(tmp_path, clients=CLIENTS)
    doc = yaml.safe_load(spec.read_text())
    # a stopped leaf holds a round open for as long as a loaded machine needs (leaf_timeout)
    doc["server"] |= {"rounds": ROUNDS, "min_clients": 2, "min_available": FIRST,
                      "aggregation": {"mode": "tree", "max_leaves": LEAVES + 1,
                                      "leaf_timeout": 600,
                                      "updates_per_leaf": PER_LEAF,
                                      "max_updates_per_leaf": PER_LEAF}}
    spec.write_text(yaml.safe_dump(doc))
    with task_platform(tmp_path, spec, clients=FIRST) as (p, clients):
        c = p.client()

        def status() -> dict:
            return c.workload("digits-fl")["status"]

        def tree() -> dict:  # the shape the server asks for this round (it writes it first)
            found = list(jobs_dir(p).glob("*/workload-*/server/tree.json"))
            return json.loads(found[0].read_text()) if found else {}

        def hold() -> psutil.Process:
            """Stop an active leaf: its round cannot close until it goes on (a client stopped
            as long would find its gRPC poll past its deadline)."""
            leaf = psutil.Process(tree()["pids"][0])
            leaf.suspend()
            return leaf

        # Rounds of this tiny model take ~0.1 s, so a stopped leaf holds the task at each
        # step. Rounds of 3 clients first: 1 leaf (4 updates a leaf at most) and a spare.
        wait_for(lambda: tree().get("round", 0) >= 2, 180, "a round of the first 3 clients")
        held = hold()
        address, leaf_port = status()["address"], int(status()["leaf_address"].split(":")[1])
        clients += [start_client(spec, p, i) for i in range(FIRST, CLIENTS)]
        assert leaf_units_listed(p) == ["leaf-0", "leaf-1"]
        port = int(address.rsplit(":", 1)[1])  # one connection a client
        wait_for(lambda: joined(port) >= CLIENTS, 300, "the other 7 clients to join")
        held.resume()
        # Then rounds of 10: 3 leaves and the spare, started as units once the server asks.
        wait_for(lambda: tree().get("leaves") == LEAVES, 120, "the server to ask for more leaves")
        wait_for(lambda: status()["leaves"]["server"] == LEAVES, 60, "the server's report")
        held = hold()
        wait_for(lambda: joined(leaf_port) >= LEAVES + 1, 300, "the leaf units to join")
        held.resume()
        wait_for(lambda: len(tree()["pids"]) == LEAVES, 60, "a round folded by 3 leaves")
        # One active leaf is stopped, so the round it is in cannot close; once it has been
        # handed that round's updates, the control plane and then the leaf are killed.
        victim = psutil.Process(tree()["pids"][-1])
        job_id = int(victim.environ()["PLINTH_JOB_ID"])
        (conn,) = [x for x in victim.net_connections("inet") if x.raddr.port == leaf_port]
        victim.suspend()
        wait_for(lambda: unread_bytes(conn.laddr.port) > 0, 60, "the stopped leaf to hold updates")
        hung = tree()["round"]  # no round starts after it now
        wait_for(lambda: status()["round"] == hung - 1, 30, f"round {hung} to be the open one")
        assert hung < ROUNDS, hung
        assert leaf_units_listed(p) == [f"leaf-{k}" for k in range(LEAVES + 1)]
        p.stop(signal.SIGKILL)
        p.start()
        c = p.client()
        units = {u["unit"]: u for u in c.workload("digits-fl")["units"]}
        assert all("re-adopted" in [e["kind"] for e in c.job(u["job_id"])["events"]]
                   for u in units.values()), units
        (unit,) = [name for name, u in units.items() if u["job_id"] == job_id]
        victim.kill()
        wait_for(lambda: {u["unit"]: u["job_id"] for u in c.workload("digits-fl")["units"]
                          }.get(unit, job_id) != job_id, 60, f"{unit} to be replaced")
        wait_for(lambda: c.workload("digits-fl")["state"] != "active", 300, "the task to end")
        done = c.workload("digits-fl")
        assert done["state"] == "succeeded", done
        per_round = done["status"]["per_round"]
        assert [r["round"] for r in per_round] == list(range(1, ROUNDS + 1))
        # a flat run of this app (`plinth fl sim`, 10 clients, 25 rounds) ends at 0.905
        assert per_round[-1]["accuracy"] > 0.85, per_round
        sizes = [r["leaves"] for r in per_round]
        assert sizes[0] == 1 and LEAVES in sizes, sizes  # resized between rounds
        # the round the leaf died in closed with the updates it held as failures, no others
        (folder,) = jobs_dir(p).glob("*/workload-*/server")
        records = Checkpointer(folder).latest().records
        lost = {r["round"]: [f for f in r["failures"] if "aggregator leaf" in f["reason"]]
                for r in records}
        (hit,) = [r for r, fs in lost.items() if fs]
        assert hit == hung and 1 <= len(lost[hit]) < CLIENTS, lost[hit]  # the others folded
        for r in records:
            assert r["updates"] + len(r["failures"]) == len(r["clients"]), r  # none vanished
        assert records[hit - 1]["metrics"]["leaf_replacements"] >= 1
        assert records[hit]["updates"] == CLIENTS  # and the next round goes on, whole

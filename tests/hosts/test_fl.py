"""An FL task across hosts on the bed: a LIFL tree of a server, 2 middle aggregators (one a
worker host) and their leaf aggregators, all units placed on the worker hosts h2 and h3 by the
scheduler; 4 clients in one process on h3 (not a unit: a data owner's machine) find their
middles through the control plane (`plinth fl client --task`). Each unit listens on its own
node's address and reports it; the rounds reach the controller as unit reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from bed import wait_for
from cluster import PLINTH

from plinth.control.users import ensure_user

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.xdist_group("hosts")]
APPS = Path(__file__).parents[1] / "fl" / "apps"
ROUNDS, CLIENTS, MIDDLES = 3, 4, 2
WORKERS = {"h2": "198.18.0.2", "h3": "198.18.0.3"}


def _app(pb, name: str) -> Path:
    """The tiny digits app as a tree-mode FLTask with 2 middles, and its clients' tokens, in
    the shared folder (the units read it from any host)."""
    folder = pb.shared / name
    folder.mkdir(mode=0o755)
    pb.bed.sh("h3", [PLINTH, "fl", "tokens", str(folder / "tokens.txt"), "--clients",
                     str(CLIENTS)])
    # the middles check them, as the tenant's user (a root Ray node runs a tenant's units so)
    user = ensure_user("default")
    os.chown(folder / "tokens.txt", user.uid, user.gid)
    doc = yaml.safe_load((APPS / "tiny.yaml").read_text())
    doc |= {"kind": "FLTask", "name": name, "code": str(APPS / "tiny.py"),
            "resources": {"cpus": 0.5, "memory": "1Gi"}, "transport": {"tokens": "tokens.txt"}}
    doc["data"]["clients"] = CLIENTS
    doc["server"] |= {"rounds": ROUNDS, "min_clients": 2, "min_available": 2,
                      "aggregation": {"mode": "tree", "max_leaves": 1, "middles": MIDDLES}}
    path = folder / "app.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_clients(pb, host: str, app: Path, name: str) -> subprocess.Popen:
    """The task's CLIENTS clients in one process on `host`, finding their server or middle
    through the control plane (`plinth fl client --task`); their output on its stdout."""
    return pb.bed.run(host, [PLINTH, "fl", "client", str(app), "--task", name, "--cids",
                             f"0-{CLIENTS - 1}", "--tokens", str(app.parent / "tokens.txt")],
                      env={**pb.env, "PLINTH_SERVER": pb.server, "PLINTH_TOKEN": pb.token,
                           "OMP_NUM_THREADS": "1"},
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _status(pb, name: str) -> dict:
    return pb.api("h3", f"/v1/workloads/{name}")


def _story(pb, name: str) -> str:
    """The task's status, and the last lines of each unit's log: what a failure shows."""
    w = _status(pb, name)
    out = [f"{w['state']} {w['status']}"]
    for u in w["units"]:
        log = pb.cli("h3", "logs", str(u["job_id"]), check=False).stdout
        out.append(f"--- {u['unit']} (job {u['job_id']}, {u['state']}):\n{log[-1500:]}")
    return "\n".join(out)


def test_an_fl_task_runs_its_tree_on_worker_hosts_with_clients_on_another(plinth_bed):
    pb, name = plinth_bed, "fl-hosts"
    app = _app(pb, name)
    pb.cli("h3", "submit", str(app))
    # the clients, started before anything is known: they ask the control plane for their
    # middle's address (cid mod 2), and wait for it to be reported
    clients = start_clients(pb, "h3", app, name)

    def reported() -> dict | None:  # the server's and both middles' addresses, while they run
        st = _status(pb, name)["status"]
        return st if st.get("address") and all(m.get("address") for m in st["middles"]) \
            else None

    try:
        st = wait_for(reported, "the server and the middles to report their addresses")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_story(pb, name)}") from None
    server_at = st["address"].rsplit(":", 1)[0]
    middles_at = {m["address"].rsplit(":", 1)[0] for m in st["middles"]}
    # each on a worker host's own address (not 0.0.0.0, loopback or the control plane's),
    # one middle a host
    assert server_at in WORKERS.values() and middles_at == set(WORKERS.values()), st
    w = wait_for(lambda: (w := _status(pb, name))["state"] != "active" and w,
                 "the task to end", timeout=300)
    out = clients.communicate(timeout=60)[0]
    assert w["state"] == "succeeded", (w, out[-3000:], pb.plane_log()[-3000:])
    assert clients.returncode == 0 and f"clients 0-{CLIENTS - 1}: " in out, out[-3000:]
    # the rounds reached the controller as the server's reports: every one, with both middles
    st = w["status"]
    assert st["round"] == ROUNDS and [r["round"] for r in st["per_round"]] == [1, 2, 3], st
    assert all(r["participants"] == MIDDLES for r in st["per_round"]), st["per_round"]
    assert all(st["leaves"][m["name"]] >= 1 for m in st["middles"]), st  # their trees' sizes
    # every unit ran on a worker host: the server, the middles (one a host), their leaves
    nodes = {u["unit"]: pb.api("h3", f"/v1/workloads/{u['job_id']}")["allocation"]["slots"][0][
        "node_name"] for u in w["units"]}
    assert {"server", "middle-0", "middle-1", "middle-0.leaf-0", "middle-1.leaf-0"} <= \
        set(nodes), nodes
    assert set(nodes.values()) <= set(WORKERS), nodes
    assert nodes["middle-0"] != nodes["middle-1"], nodes
    for unit, node in nodes.items():
        if ".leaf-" in unit:
            assert node == nodes[unit.split(".")[0]], nodes  # a leaf beside its middle
    # and each unit's address was its own node's
    assert WORKERS[nodes["server"]] == server_at, (nodes, st)
    assert {WORKERS[nodes[m["name"]]] for m in st["middles"]} == middles_at, (nodes, st)

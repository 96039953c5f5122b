"""A Tune task across hosts on the bed: its tracker, servers and clients spread over h2 and h3,
submitted from h3. The tracker and each server bind their own node's address and report it; the
servers reach the tracker, and the clients the tracker and the servers, at those addresses, on
whichever host they run; each client reports what it tuned, and its records land in the
task's database on the shared folder."""

from __future__ import annotations

import json
import re
import sys

import pytest
from bed import wait_for

from plinth.tune.db import listing, model_key

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.xdist_group("hosts")]
pytest.importorskip("tvm")
MODEL, SHAPE = "plinth.tune.models:tiny_linear", [1, 64]
HOSTS = {"198.18.0.2": "h2", "198.18.0.3": "h3"}  # the worker hosts, by address
SERVING = ("tracker", "server-share-2-0", "server-share-3-0")
CLIENTS = ("client-share-2-0", "client-share-3-0")
READ = ("import json, os, sys; from plinth.client import Client; "
        "print(json.dumps(Client(os.environ['PLINTH_SERVER'], os.environ['PLINTH_TOKEN'])"
        ".workload(sys.argv[1])))")


def _workload(pb, host: str, name: str) -> dict:
    """The workload as the API answers it, asked from `host`."""
    env = {**pb.env, "PLINTH_SERVER": pb.server, "PLINTH_TOKEN": pb.token}
    return json.loads(pb.bed.sh(host, [sys.executable, "-c", READ, name], env=env).stdout)


def _ran_on(pb, job_id: int) -> set[str]:
    """The hosts every attempt of a job ran on, from its log's headers."""
    log = pb.cli("h3", "logs", str(job_id)).stdout
    return set(re.findall(r"=== plinth: attempt \d+ of job \d+ .* starts at .* on (\S+) ===",
                          log))


def test_a_tune_task_spreads_over_two_hosts_and_its_results_reach_the_plane(plinth_bed):
    pb = plinth_bed
    db = pb.shared / "tune-db"
    db.mkdir()
    db.chmod(0o777)  # the tenant's user writes here
    spec = pb.shared / "spread.yaml"
    # Shares of 2 and 3 cores: 5 cores, more than one worker host has (4), so the two servers
    # run on different hosts, and some unit talks to the tracker from the other one.
    spec.write_text(f"kind: Tune\nname: spread\nmodel: {MODEL}\ninput_shape: {SHAPE}\n"
                    f"shares: [2, 3]\ntrials: 4\ntrials_per_iter: 2\nbuilder: inline\n"
                    f"db: {db}\n")
    pb.cli("h3", "submit", str(spec), timeout=300)
    w = wait_for(lambda: (x := _workload(pb, "h3", "spread"))["state"] != "active" and x,
                 "the Tune task to end", timeout=900)
    ran: dict[str, set[str]] = {}
    for job in w["history"]:  # every job of every unit
        ran.setdefault(job["unit"], set()).update(_ran_on(pb, job["job_id"]))
    assert w["state"] == "succeeded", (w, ran, pb.plane_log()[-3000:])

    # Where each unit ran: the servers on the two worker hosts, and every unit on one of them.
    assert set(ran) == {*SERVING, *CLIENTS}, ran
    assert set().union(*ran.values()) == {"h2", "h3"}, ran
    assert ran["server-share-2-0"] != ran["server-share-3-0"], ran
    # Each address was bound on the node the unit ran on, as it reported it.
    st = w["status"]
    for unit in SERVING:
        host, _, port = st["addresses"][unit]["address"].rpartition(":")
        assert HOSTS.get(host) in ran[unit] and int(port) > 0, (unit, st["addresses"], ran)
    # What the clients tuned reached the controller; their records, the shared database.
    assert set(st["results"]) == set(CLIENTS), st
    assert all(r["tasks"] == 1 and r["records"] >= 1 for r in st["results"].values()), st
    key = model_key(MODEL, SHAPE)
    assert {(e.model, e.share) for e in listing(db) if e.records >= 1} == {(key, 2.0), (key, 3.0)}

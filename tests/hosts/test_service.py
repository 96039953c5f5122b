"""A Service across hosts on the bed: its router and replicas are units the scheduler places on
the worker hosts, the router at its node's address, which it reports and `plinth show` prints;
requests sent from h3 (not the control plane's host) are answered through it. Then kill -9 of
the control plane mid-load: the data plane does not pass through it, so not one request fails,
and the control plane started again adopts the service's units where they run."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from bed import wait_for

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.xdist_group("hosts")]
LOAD = Path(__file__).parent / "load.py"
WORKERS = ("198.18.0.2", "198.18.0.3")
SERVICE = """\
kind: Service
name: digits
model: tiny-cnn
input_shape: [784]
slo_ms: 500
resources: {cpus: 0.5, memory: 1Gi}
min_replicas: 2
max_replicas: 2
"""


def _progress(out: Path) -> dict:
    try:
        return json.loads(out.read_text())
    except (FileNotFoundError, ValueError):
        return {"ok": 0, "codes": {}}


def test_a_service_answers_another_host_through_its_router_and_outlives_the_plane(
        plinth_bed):
    pb = plinth_bed
    spec = pb.shared / "digits.yaml"
    spec.write_text(SERVICE)
    pb.cli("h3", "submit", str(spec))
    w = wait_for(lambda: (w := pb.api("h3", "/v1/workloads/digits"))["status"].get("ready") == 2
                 and w, "its router and two replicas, ready")
    url = w["status"]["url"]
    assert urlparse(url).hostname in WORKERS and url.endswith("/v1/digits/infer"), url
    units = {u["unit"]: u["job_id"] for u in w["units"] if u["state"] == "running"}
    assert set(units) == {"router", "replica-0", "replica-1"}, w["units"]
    for job_id in units.values():
        slot = pb.api("h3", f"/v1/workloads/{job_id}")["allocation"]["slots"][0]
        assert slot["node_name"] in ("h2", "h3"), slot  # the head offers nothing to run on
    assert f"address: {url}" in pb.cli("h3", "show", "digits").stdout

    # Load from h3 through the router; kill -9 of the control plane on h1 mid-load.
    out = pb.shared / "load.json"
    load = pb.bed.run("h3", [sys.executable, str(LOAD), url, str(out), "--clients", "4"],
                      env=pb.env)
    try:
        wait_for(lambda: _progress(out)["ok"] >= 20, "answers before the kill")
        pb.plane.kill()
        pb.plane.wait()
        during = _progress(out)["ok"]
        wait_for(lambda: _progress(out)["ok"] >= during + 100,
                 "answers while the control plane is dead")
        pb.start_plane()
        after = pb.api("h3", "/v1/workloads/digits")
        wait_for(lambda: _progress(out)["ok"] >= during + 200, "answers after its restart")
    finally:
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=60)
    got = _progress(out)
    assert got["done"] and set(got["codes"]) == {"200"}, got["codes"]  # not one failed

    # The control plane started again adopts the service as it was: the same address, the
    # same unit jobs running where they ran.
    assert after["state"] == "active" and after["status"]["url"] == url
    assert {u["unit"]: u["job_id"] for u in after["units"] if u["state"] == "running"} == units
    events = [e["kind"] for e in pb.api("h3", f"/v1/workloads/{units['router']}")["events"]]
    assert "re-adopted" in events, events
    wait_for(lambda: pb.api("h3", "/v1/workloads/digits")["status"].get("ready") == 2,
             "the router's reports to reach the control plane again")

    pb.cli("h3", "cancel", "digits")  # its CPUs back, for the bed's other tests
    wait_for(lambda: all(u["state"] == "cancelled"
                         for u in pb.api("h3", "/v1/workloads/digits")["units"]),
             "its units to stop")

"""Jobs across hosts on the bed: a job placed on a worker host, and a gloo gang of 4 workers
across two hosts whose ranks agree on an all-reduce. Submitted from h3, not the control plane's
host; the gang's ranks find each other at the address of rank 0's node."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.xdist_group("hosts")]
GLOO = Path(__file__).parents[1] / "runtime" / "gloo_worker.py"


def _spec(pb, name: str, text: str) -> str:
    path = pb.shared / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def _log(pb, name: str) -> str:
    jobs = json.loads(pb.cli("h3", "ls", "--all", "-o", "json").stdout)
    return pb.cli("h3", "logs", str(next(j["id"] for j in jobs if j["name"] == name))).stdout


def test_a_job_runs_on_a_worker_host_as_its_tenant_and_its_output_reaches_the_plane(
        plinth_bed):
    spec = _spec(plinth_bed, "where", (
        "name: where\n"
        "command: [python3, -c, 'import getpass, socket; "
        "print(\"on\", socket.gethostname(), \"as\", getpass.getuser())']\n"
        "resources: {cpus: 1}\n"))
    plinth_bed.cli("h3", "submit", "--wait", spec)
    log = _log(plinth_bed, "where")
    placed = re.search(r"starts at .* on (\S+) ===", log)
    assert placed and placed[1] in ("h2", "h3"), log  # the head offers nothing to run on
    # It ran there, as the tenant's own Unix user (the Ray node runs as root), and its output
    # came back to the control plane's host.
    assert f"\non {placed[1]} as plinth-default\n" in log, log


def test_a_gloo_gang_of_4_across_two_hosts_agrees_on_an_all_reduce(plinth_bed):
    out = plinth_bed.shared / "gang-out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the tenant's user writes here
    spec = _spec(plinth_bed, "gang", (
        f"name: gang\ncommand: [{sys.executable}, {GLOO}, {out}]\nworkers: 4\n"
        "resources: {cpus: 0.5, gpus: 1, memory: 1Gi}\n"))
    done = plinth_bed.cli("h3", "submit", "--wait", spec, check=False, timeout=300)
    assert done.returncode == 0, done.stderr + _log(plinth_bed, "gang")
    reports = [json.loads((out / f"{r}.json").read_text()) for r in range(4)]
    assert [r["sum"] for r in reports] == [10.0] * 4  # 1 + 2 + 3 + 4 on every rank
    masters = {r["env"]["MASTER_ADDR"] for r in reports}
    assert len(masters) == 1 and masters <= {"198.18.0.2", "198.18.0.3"}, masters
    assert sorted(r["env"]["LOCAL_RANK"] for r in reports) == ["0", "0", "1", "1"]


def test_a_job_that_needs_what_no_ray_node_offers_is_refused_in_one_line(plinth_bed):
    """A node no Ray node is (nodelist), a GPU model no Ray node has: refused at submit in
    one line naming the field, and what was accepted before is untouched."""
    before = json.loads(plinth_bed.cli("h3", "ls", "--all", "-o", "json").stdout)
    for name, extra, field in (
            ("nowhere", "nodelist: [h9]\n", "h9"),
            ("no-such-gpu", "resources: {cpus: 1, gpus: 1, gpu_model: [H100]}\n", "H100")):
        spec = _spec(plinth_bed, name, f"name: {name}\ncommand: [hostname]\n{extra}")
        done = plinth_bed.cli("h3", "submit", spec, check=False)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and field in lines[0], done.stderr
    after = json.loads(plinth_bed.cli("h3", "ls", "--all", "-o", "json").stdout)
    assert [(j["id"], j["state"]) for j in after] == [(j["id"], j["state"]) for j in before]

"""A tenant on the Ray nodes of the bed, attacking as a hostile tenant would: its job runs as its
own Unix user on a worker host (the Ray node runs as root), and tries to become root through
Ray itself: it joins the cluster as a driver, at the head's address and through the node's own
raylet ("auto"), and asks Ray to run a task, which would run as root. Ray's token
authentication (the token readable by root alone) must refuse it."""

from __future__ import annotations

import json
import sys

import pytest

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.xdist_group("hosts")]

ATTACK = """
import os, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("ESCALATED", sys.argv[1], ray.get(ray.remote(lambda: os.getuid()).remote()), flush=True)
"""


def test_a_tenants_job_cannot_join_ray_and_run_a_task_as_root(plinth_bed):
    pb = plinth_bed
    script = pb.shared / "attack.py"
    script.write_text(ATTACK)
    script.chmod(0o644)
    spec = pb.shared / "attack.yaml"
    # Each way in gets 40 s (Ray retries a refused driver for a minute and more).
    tries = (f"for a in {pb.head}:6379 auto; do timeout 40 {sys.executable} {script} $a "
             "|| echo refused $a; done")
    spec.write_text(f"name: attack\ncommand: [sh, -c, '{tries}']\nresources: {{cpus: 1}}\n"
                    "max_runtime: 4m\n")
    pb.cli("h3", "submit", "--wait", str(spec), check=False, timeout=300)
    jobs = json.loads(pb.cli("h3", "ls", "--all", "-o", "json").stdout)
    job = next(j for j in jobs if j["name"] == "attack")
    log = pb.cli("h3", "logs", str(job["id"])).stdout
    assert "ESCALATED" not in log, log
    assert f"refused {pb.head}:6379" in log and "refused auto" in log, log
    assert "InvalidAuthToken" in log, log  # the head refused it for want of the token

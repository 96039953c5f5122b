"""/metrics of a control plane in virtual time (virtual.py), parsed with prometheus_client's own
parser after a known sequence of submissions and completions."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from virtual import VirtualPlatform

from plinth.runtime.sim_behaviour import SimBehaviour


def job(name: str, gpus: int) -> dict:
    return {"name": name, "command": ["true"], "resources": {"cpus": 0.1, "memory": "1Gi",
                                                             "gpus": gpus}}


def scrape(vp: VirtualPlatform, token: str | None = None) -> dict[tuple[str, tuple], float]:
    with vp.client(token) as c:
        r = c._http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def test_metrics_after_known_submissions(vp) -> None:
    vp.behave("hog", SimBehaviour(exit_at=600.0))
    with vp.client() as admin:
        admin.set_tenant("team-b", None, None)
        b_token = admin.add_token("team-b")
        done = [admin.submit(job(f"quick-{i}", 1)) for i in range(2)]
        vp.run_until(lambda: all(admin.job(j)["state"] == "succeeded" for j in done), 30)
        # Not preemptible: team-b's fair share must not take the hog's GPUs back mid-test.
        hog = admin.submit({**job("hog", 4), "preemptible": False})
        vp.step()
        assert admin.job(hog)["state"] == "running"
        queued = [admin.submit(job(f"queued-{i}", 1)) for i in range(2)]
    with vp.client(b_token) as b:
        b_job = b.submit(job("b-queued", 2))
        vp.step()
        assert b.job(b_job)["reason"] not in ("", "queued")

    m = scrape(vp)
    assert m[("plinth_jobs_submitted_total", (("kind", "Job"), ("tenant", "default")))] == 5
    assert m[("plinth_jobs_submitted_total", (("kind", "Job"), ("tenant", "team-b")))] == 1
    assert m[("plinth_jobs", (("state", "succeeded"),))] == 2
    assert m[("plinth_jobs", (("state", "running"),))] == 1
    assert m[("plinth_jobs", (("state", "pending"),))] == 3
    assert m[("plinth_queue_depth", (("kind", "Job"), ("tenant", "default")))] == len(queued)
    assert m[("plinth_queue_depth", (("kind", "Job"), ("tenant", "team-b")))] == 1
    assert m[("plinth_gpus_allocated", (("model", "A100"),))] == 4
    assert m[("plinth_gpus_free", (("model", "A100"),))] == 0
    # Three starts, each decided by a pass; every pass was timed.
    assert m[("plinth_scheduler_decisions_total", (("kind", "started"),))] == 3
    passes = m[("plinth_scheduler_pass_seconds_count", ())]
    assert passes >= 3
    assert m[("plinth_scheduler_pass_seconds_bucket", (("le", "+Inf"),))] == passes
    assert 0 < m[("plinth_scheduler_pass_seconds_sum", ())] < passes * 1.0
    # Each submission, start and finish is at least one committed store write.
    assert m[("plinth_store_transaction_seconds_count", ())] >= 6 + 3 + 2
    # The hooks for kinds that do not run here yet are declared, with no series.
    assert not any(name.startswith(("plinth_fl_", "plinth_service_")) for name, _ in m)

    with vp.client() as admin:
        admin.cancel(hog)
        vp.run_until(lambda: admin.job(hog)["state"] == "cancelled", 30)
        vp.run_until(lambda: admin.job(queued[0])["state"] != "pending", 30)
    m = scrape(vp)
    assert m[("plinth_jobs", (("state", "cancelled"),))] == 1
    assert m[("plinth_scheduler_decisions_total", (("kind", "started"),))] >= 4


@pytest.mark.parametrize("who", ["none", "bogus", "tenant"])
def test_metrics_need_an_admin_token(vp, who) -> None:
    token = {"none": "", "bogus": "plt_not-a-token"}.get(who)
    if who == "tenant":
        with vp.client() as admin:
            admin.set_tenant("peek", None, None)
            token = admin.add_token("peek")
    with vp.client(token) as c:
        r = c._http.get("/metrics")
    assert r.status_code == (403 if who == "tenant" else 401)
    assert "plinth_" not in r.text and len(r.json()["detail"].splitlines()) == 1


def test_the_grafana_example_reads_only_exposed_metrics(vp) -> None:
    import json
    import re
    from pathlib import Path

    board = json.loads((Path(__file__).parents[2] / "examples/grafana/plinth.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|total)$", "", m) for e in exprs
            for m in re.findall(r"\bplinth_[a-z_]+", e)}
    r = vp.http.get("/metrics")
    exposed = {f.name for f in text_string_to_metric_families(r.text)}
    assert used and used <= exposed, used - exposed
    assert len(used) == 11  # every metric the control plane exports has a panel

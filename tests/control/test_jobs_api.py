"""Jobs through the API on a control plane in virtual time (virtual.py): cancel, time limits,
refusals at submit, tenants kept apart, nodes, quotas, and every platform policy. What only a
real process shows (its output, its environment) is in test_platform.py."""

from __future__ import annotations

import pytest
from virtual import EPOCH, VirtualPlatform

from plinth.client import ApiError
from plinth.runtime.sim_behaviour import SimBehaviour


def job(name: str = "t", **extra) -> dict:
    spec = {"name": name, "command": ["true"],
            "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 1}}
    spec["resources"].update(extra.pop("resources", {}))
    return {**spec, **extra}


@pytest.fixture
def vp(vp):
    vp.behave("long", SimBehaviour(exit_at=600.0))
    # a stop's SIGTERM ends a simulated job at once: this one takes the grace to stop
    vp.behave("slow-to-stop", SimBehaviour(exit_at=600.0, ignore_term=True))
    return vp


def test_cancel_pending_and_running(vp) -> None:
    with vp.client() as c:
        run = c.submit(job("slow-to-stop", resources={"gpus": 4}))
        vp.step()
        assert c.job(run)["state"] == "running"
        queued = c.submit(job("queued", resources={"gpus": 4}))
        vp.step()
        assert c.job(queued)["reason"] not in ("", "queued")
        assert c.job(queued)["state"] == "pending"
        assert c.cancel(queued) == "cancelled"
        assert c.cancel(run) == "stopping"
        vp.run_until(lambda: c.job(run)["state"] == "cancelled", limit_s=30)
        with pytest.raises(ApiError, match="already finished") as e:
            c.cancel(run)
        assert e.value.status == 409
        assert c.job(queued)["start_time"] is None  # it never ran


def test_time_limit(vp) -> None:
    with vp.client() as c:
        j = c.submit(job("long", max_runtime=1))
        vp.run_until(lambda: c.job(j)["state"] == "timeout", limit_s=30)
        d = c.job(j)
        assert any(e["kind"] == "stop-timeout" for e in d["events"])
        assert d["end_time"] - d["start_time"] == 1.0


def test_never_fits_is_rejected_at_submit(vp) -> None:
    with vp.client() as c:
        with pytest.raises(ApiError, match="can never run here: asks for 8 GPUs") as e:
            c.submit(job(resources={"gpus": 8}))
        assert e.value.status == 422
        with pytest.raises(ApiError, match="no GPU of an allowed model"):
            c.submit(job(resources={"gpu_model": "H100"}))
        assert c.jobs(all=True) == []


def test_bad_input_over_http_names_the_field(vp) -> None:
    bad = {"name": "x", "command": ["true"], "resources": {"gpus": -1}}
    r = vp.http.post("/v1/workloads", json=bad)
    assert r.status_code == 422 and r.json()["detail"].startswith("resources.gpus:")
    r = vp.http.post("/v1/workloads", content=b"{not json")
    assert r.status_code == 422
    r = vp.http.post("/v1/workloads", json={"name": "x", "command": ["true"], "colour": "red"})
    assert r.status_code == 422 and "colour" in r.json()["detail"]


def test_tenants_cannot_touch_each_other(vp) -> None:
    with vp.client() as admin:
        admin.set_tenant("alpha", gpus=2)
        admin.set_tenant("beta", gpus=2)
        ta, tb = admin.add_token("alpha"), admin.add_token("beta")
    with vp.client(ta) as a, vp.client(tb) as b:
        j = a.submit(job("long"))
        assert a.job(j)["tenant"] == "alpha"
        assert j not in [x["id"] for x in b.jobs(all=True)]
        assert b.jobs(tenant="alpha") == []
        for call in (lambda: b.job(j), lambda: b.cancel(j), lambda: b.logs(j)):
            with pytest.raises(ApiError) as e:
                call()
            assert e.value.status == 404
        with pytest.raises(ApiError) as e:
            b.submit(job(tenant="alpha"))
        assert e.value.status == 403
        with pytest.raises(ApiError) as e:
            b.tenants()
        assert e.value.status == 403
        vp.step()
        assert a.job(j)["state"] == "running"
        assert a.cancel(j) == "cancelled"
    for token in ("", "nope"):  # none, and one that is not a token
        with vp.client(token) as stranger, pytest.raises(ApiError) as e:
            stranger.jobs()
        assert e.value.status == 401


def test_nodes_report_allocations(vp) -> None:
    with vp.client() as c:
        j = c.submit(job("long", resources={"gpus": 0, "gpu_fraction": 0.5}))
        vp.step()
        assert c.job(j)["state"] == "running"
        (node,) = c.nodes()
        assert node["gpus"] == 4 and node["gpu_model"] == "A100"
        assert j in node["running"] and sorted(node["gpu_free_milli"]) == [500, 1000, 1000, 1000]
        c.cancel(j)
        vp.run_until(lambda: c.job(j)["state"] == "cancelled", limit_s=30)
        assert c.nodes()[0]["gpu_free_milli"] == [1000] * 4 and c.nodes()[0]["running"] == []


def test_gpu_quota_is_enforced(vp) -> None:
    """A tenant with a nominal quota of 1 GPU and no borrowing runs one 1-GPU job at a time,
    though the cluster has 4 idle GPUs; the other waits and says why."""
    with vp.client() as admin:
        admin.set_tenant("small", gpus=1, borrowing_limit=0)
        admin.set_tenant("big", gpus=3)
        token = admin.add_token("small")
    with vp.client(token) as c:
        first, second = c.submit(job("long")), c.submit(job("long"))
        vp.step()
        assert c.job(first)["state"] == "running"
        assert c.job(second)["state"] == "pending"
        assert "quota" in c.job(second)["reason"].lower()
        vp.advance(60)
        assert c.job(second)["state"] == "pending"  # still, however long it waits
        c.cancel(first)
        vp.run_until(lambda: c.job(second)["state"] == "running", limit_s=30)
        assert c.job(first)["state"] == "cancelled"


def test_tenants_without_a_quota_share_what_the_quotas_leave(vp) -> None:
    """Giving one tenant a quota of 1 of the 4 GPUs leaves the other 3 to the tenants without
    one (here `default`): a 3-GPU job of `default` runs on its own nominal quota. It was held to
    0 nominal GPUs, so it could only borrow `alpha`'s 1 idle GPU and waited for ever."""
    with vp.client() as c:
        c.set_tenant("alpha", gpus=1)
        j = c.submit(job("long", resources={"gpus": 3}))
        vp.step()
        assert c.job(j)["state"] == "running", c.job(j)["reason"]


@pytest.mark.parametrize("policy", ["fifo", "sjf", "priority", "tiresias"])
def test_every_platform_policy_runs_jobs(policy, tmp_path) -> None:
    """drf is the default and is covered above; the other platform policies run a 2-job queue
    on a cluster that holds one job at a time."""
    with VirtualPlatform(tmp_path, policy=policy) as vp, vp.client() as c:
        vp.behave("whole", SimBehaviour(exit_at=10.0))
        assert c.health()["policy"] == policy
        ids = [c.submit(job("whole", resources={"gpus": 4}, max_runtime=60)) for _ in range(2)]
        vp.run_until(lambda: all(c.job(j)["state"] == "succeeded" for j in ids), limit_s=60)
        spans = sorted((c.job(j)["start_time"] - EPOCH, c.job(j)["end_time"] - EPOCH)
                       for j in ids)
        assert spans == [(0.0, 10.0), (10.0, 20.0)]  # one at a time, the second at once after

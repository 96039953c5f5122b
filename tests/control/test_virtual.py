"""The control plane in virtual time (virtual.py): jobs that act out what they are told, on a
clock that moves only when the test moves it, through the real API, store, owner and driver."""

from __future__ import annotations

import pytest
from virtual import EPOCH, VirtualPlatform

from plinth.runtime.sim_behaviour import SimBehaviour


@pytest.fixture
def vp(tmp_path):
    with VirtualPlatform(tmp_path, grace_s=5.0) as p:
        yield p


def test_a_job_runs_for_as_long_as_it_is_told_and_exits_with_its_code(vp) -> None:
    vp.behave("train", SimBehaviour(exit_at=42.0, exit_code=3))
    with vp.client() as c:
        j = c.submit({"name": "train", "command": ["true"], "retries": 1})
        took = vp.run_until(lambda: c.job(j)["state"] == "failed", limit_s=600)
        job = c.job(j)
    assert took == 84.0 and job["attempt"] == 2  # retried once, each attempt 42 s
    assert (job["submit_time"], job["end_time"]) == (EPOCH, EPOCH + 84.0)
    assert [e["kind"] for e in job["events"]] == ["submitted", "started", "retry", "started",
                                                  "failed"]


def test_a_job_that_ignores_sigterm_is_killed_when_the_grace_runs_out(vp) -> None:
    vp.behave("stubborn", SimBehaviour(exit_at=600.0, ignore_term=True))
    with vp.client() as c:
        j = c.submit({"name": "stubborn", "command": ["true"]})
        vp.advance(10)
        assert c.cancel(j) == "stopping"
        vp.advance(4.9)
        assert c.job(j)["state"] == "stopping"
        vp.advance(0.1)
        job = c.job(j)
    assert job["state"] == "cancelled" and job["end_time"] == EPOCH + 15.0
    assert job["exit_code"] == 137  # the SIGKILL after the 5 s grace


def test_a_time_limit_stops_the_job_at_its_limit(vp) -> None:
    vp.behave("long", SimBehaviour(exit_at=3600.0))
    with vp.client() as c:
        j = c.submit({"name": "long", "command": ["true"], "max_runtime": "1m"})
        vp.run_until(lambda: c.job(j)["state"] == "timeout", limit_s=120)
        assert c.job(j)["end_time"] == EPOCH + 60.0


def test_a_queue_drains_in_virtual_time_without_sleeping(vp) -> None:
    """Eight one-GPU jobs of 100 s on four GPUs: two waves, at 0 and at 100 s."""
    vp.behave("wave", SimBehaviour(exit_at=100.0))
    with vp.client() as c:
        ids = [c.submit({"name": "wave", "command": ["true"], "resources": {"gpus": 1}})
               for _ in range(8)]
        vp.run_until(lambda: all(c.job(j)["state"] == "succeeded" for j in ids), limit_s=300)
        starts = sorted(c.job(j)["start_time"] - EPOCH for j in ids)
    assert starts == [0.0] * 4 + [100.0] * 4

"""A preempted job is requeued and resumes from its checkpoint, on a control plane in virtual
time (virtual.py). The job SDK's own save and resume under a real stop are in
tests/runtime/test_examples.py and test_round_policies.py (Gavel on a real `plinth up`); a
priority preemption on a real platform in tests/runtime/test_up_ray.py."""

from __future__ import annotations

from virtual import EPOCH

from plinth.runtime.sim_behaviour import SimBehaviour

WORK_S = 30.0


def test_preempted_job_resumes_from_its_checkpoint(vp) -> None:
    # 30 s of work that saves every second in its first attempt (step = seconds done), then
    # goes on from its last save; the urgent job comes at 3.5 s
    saves = tuple((float(t), t) for t in range(1, int(WORK_S)))
    vp.behave("resumable", SimBehaviour(checkpoints=saves), attempt=1)
    vp.behave("resumable", SimBehaviour(), attempt=2)
    with vp.client() as c:
        low = c.submit({"name": "resumable", "priority": 0, "max_runtime": WORK_S,
                        "command": ["python", "examples/jobs/resumable.py"],
                        "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 4}})
        vp.advance(3.5)
        high = c.submit({"name": "urgent", "priority": 10, "command": "echo urgent-ran",
                         "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 1}})
        vp.step()
        d = c.job(low)
        assert d["state"] == "pending" and d["preemptions"] == 1
        assert (d["checkpoint_step"], d["checkpoint_time"]) == (3, EPOCH + 3.0)
        vp.run_until(lambda: c.job(high)["state"] == "succeeded", limit_s=60)
        vp.run_until(lambda: c.job(low)["state"] == "succeeded", limit_s=120)
        d = c.job(low)
        kinds = [e["kind"] for e in d["events"]]
        assert kinds == ["submitted", "started", "stop-preempt", "preempted", "started",
                         "succeeded"]
        assert d["attempt"] == 2 and d["preemptions"] == 1
        # It resumed from step 3: the 3 s saved are not done again, the half second after
        # the save is (no step lost, none counted twice).
        resumed = [e["time"] for e in d["events"] if e["kind"] == "started"][-1]
        assert d["end_time"] - resumed == WORK_S - 3
        # The urgent job started only after the preempted one had released its GPUs.
        # "started" is the decision; "launched" is when its processes could start.
        urgent = [e for e in c.job(high)["events"] if e["kind"] == "launched"]
        assert len(urgent) == 1
        preempted_at = next(e["time"] for e in d["events"] if e["kind"] == "preempted")
        assert urgent[0]["time"] >= preempted_at

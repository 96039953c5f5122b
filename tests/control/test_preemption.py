"""A preempted job is requeued and resumes from its checkpoint (plinth.job), end to end."""

from __future__ import annotations

import re


def test_preempted_job_resumes_from_its_checkpoint(platform, wait_for) -> None:
    with platform.client() as c:
        low = c.submit({"name": "resumable", "priority": 0,
                        "command": ["python", "examples/jobs/resumable.py", "--steps", "30",
                                    "--sleep", "0.1"],
                        "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 4}})
        wait_for(lambda: "step 3\n" in c.logs(low), what="a few checkpointed steps")
        high = c.submit({"name": "urgent", "priority": 10, "command": "echo urgent-ran",
                         "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 1}})
        assert c.wait(high, timeout=60) == "succeeded"
        assert c.wait(low, timeout=120) == "succeeded"
        d = c.job(low)
        kinds = [e["kind"] for e in d["events"]]
        assert kinds == ["submitted", "started", "stop-preempt", "preempted", "started",
                         "succeeded"]
        assert d["attempt"] == 2 and d["preemptions"] == 1
        assert d["checkpoint_step"] is not None and d["checkpoint_time"] is not None
        log = c.logs(low)
        resumed = int(re.search(r"resumed from step (\d+)", log).group(1))
        assert resumed >= 3
        assert "done at step 30, total 465" in log  # no step lost or counted twice
        # The urgent job started only after the preempted one had released its GPUs.
        # "started" is the decision; "launched" is when its processes could start.
        urgent = [e for e in c.job(high)["events"] if e["kind"] == "launched"]
        assert len(urgent) == 1
        urgent_start = urgent[0]["time"]
        preempted_at = next(e["time"] for e in d["events"] if e["kind"] == "preempted")
        assert urgent_start >= preempted_at

"""The example jobs under the runtime: training on the CPU, and resuming after a stop."""

from __future__ import annotations

import re

from conftest import EXAMPLES, JOB, PY, spec, wait_end, wait_for

from plinth.runtime import EventKind


def test_resumable_resumes_after_a_stop(make_rt, tmp_path):
    rt = make_rt()
    log = tmp_path / "job.log"
    cmd = (PY, str(EXAMPLES / "resumable.py"), "--steps", "6", "--sleep", "0.05")
    ck = str(tmp_path / "ck")
    rt.launch(spec(tmp_path, cmd, attempt=1, checkpoint_dir=ck))
    wait_for(lambda: log.exists() and "step 2\n" in log.read_text(), "step 2")
    rt.stop(JOB, 1, grace_s=30)
    ev, saves = wait_end(rt)
    assert ev.kind is EventKind.EXITED
    assert saves and all(s.attempt == 1 for s in saves)
    if ev.exit_code == 0:  # it finished before the SIGTERM came: nothing to resume
        return
    assert ev.exit_code == 143
    rt.launch(spec(tmp_path, cmd, attempt=2, checkpoint_dir=ck))
    ev, saves2 = wait_end(rt)
    text = log.read_text()
    assert ev.exit_code == 0, text
    m = re.search(r"resumed from step (\d+) \(attempt 2\)", text)
    assert m and int(m.group(1)) >= 2 and "done at step 6, total 21" in text
    # Saves are reported as the platform sees them: attempt 2 from where it resumed, the last
    # one (step 6) before the exit.
    steps = [s.step for s in saves2]
    assert steps[-1] == 6 and steps == sorted(steps) and steps[0] > int(m.group(1))
    assert all(s.attempt == 2 for s in saves2)


def test_train_mnist_cnn_on_the_cpu(make_rt, tmp_path):
    rt = make_rt()
    cmd = (PY, str(EXAMPLES / "train_mnist_cnn.py"), "--steps", "30", "--checkpoint-every", "10")
    rt.launch(spec(tmp_path, cmd, checkpoint_dir=str(tmp_path / "ck")))
    ev, saves = wait_end(rt)
    text = (tmp_path / "job.log").read_text()
    assert ev.exit_code == 0, text
    assert saves and saves[-1].step == 30
    assert "steps/s" in text and (tmp_path / "ck" / "checkpoint.pt").exists()

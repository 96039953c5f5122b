"""plinth.job: checkpoints and their markers, should_stop on SIGTERM, ranks; importable
without torch; a real job's saves reach the local runtime as CHECKPOINTED events."""

from __future__ import annotations

import json
import subprocess
import time

import psutil
import pytest
from conftest import JOB, PY, spec, wait_events, wait_for

from plinth import job
from plinth.runtime import EventKind


@pytest.fixture
def ckdir(tmp_path, monkeypatch):
    monkeypatch.setenv("PLINTH_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.delenv("RANK", raising=False)
    return tmp_path / "ck"


def test_checkpoint_round_trip_keeps_the_latest(ckdir):
    assert job.load_checkpoint() is None and not job.is_restart()
    assert job.save_checkpoint({"w": [1, 2]}, 10)
    assert job.save_checkpoint({"w": [3]}, 20)
    assert job.load_checkpoint() == ({"w": [3]}, 20) and job.is_restart()
    # No temp files left; the marker tells the platform about the latest save.
    assert sorted(p.name for p in ckdir.iterdir()) == [job.CHECKPOINT_MARKER, job.CHECKPOINT_FILE]
    marker = json.loads((ckdir / job.CHECKPOINT_MARKER).read_text())
    assert (marker["step"], marker["attempt"]) == (20, 0)
    assert abs(marker["time"] - time.time()) < 3600  # epoch seconds, not a monotonic clock


def test_only_rank_0_writes_unless_asked(ckdir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert not job.save_checkpoint({"a": 1}, 1)
    assert job.save_checkpoint({"a": 1}, 1, all_ranks=True)
    assert job.load_checkpoint(all_ranks=True) == ({"a": 1}, 1)
    assert job.load_checkpoint() is None


def test_no_checkpoint_dir_means_no_checkpoints(monkeypatch):
    monkeypatch.delenv("PLINTH_CHECKPOINT_DIR", raising=False)
    assert job.checkpoint_dir() is None
    assert job.save_checkpoint({}, 1) is False and job.load_checkpoint() is None
    assert job.report_checkpoint(1) is False


def test_report_checkpoint_writes_the_marker_from_rank_0_only(ckdir, monkeypatch):
    monkeypatch.setenv("PLINTH_ATTEMPT", "3")
    assert job.report_checkpoint(12)
    assert json.loads((ckdir / job.CHECKPOINT_MARKER).read_text())["step"] == 12
    assert json.loads((ckdir / job.CHECKPOINT_MARKER).read_text())["attempt"] == 3
    monkeypatch.setenv("RANK", "1")
    assert not job.report_checkpoint(13)
    assert json.loads((ckdir / job.CHECKPOINT_MARKER).read_text())["step"] == 12
    assert [p.name for p in ckdir.iterdir()] == [job.CHECKPOINT_MARKER]


@pytest.mark.parametrize("step", [-1, 1.5, "3", True, None])
def test_report_checkpoint_refuses_a_step_that_is_not_a_count(ckdir, step):
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        job.report_checkpoint(step)
    assert not ckdir.exists()


def test_a_real_jobs_saves_become_events_before_its_exit(make_rt, tmp_path):
    # The job saves at step 3, waits until the test has seen that event, then saves at step 7
    # and exits. The test holds the watcher back (its lock) until the job has exited, so the
    # save and the exit are found in one tick: the save must still come first.
    go = tmp_path / "go"
    prog = ("import os, sys, time; from plinth import job\n"
            "job.save_checkpoint({'w': 1}, 3)\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
            "job.save_checkpoint({'w': 2}, 7)\n")
    rt = make_rt()
    h = rt.launch(spec(tmp_path, (PY, "-c", prog, str(go)), checkpoint_dir=str(tmp_path / "ck")))
    [ev] = wait_events(rt)
    assert (ev.job_id, ev.attempt, ev.kind, ev.step) == (JOB, 1, EventKind.CHECKPOINTED, 3)
    assert ev.at is not None and abs(ev.at - time.time()) < 600
    shim = psutil.Process(h.procs[0].pid)
    with rt._lock:
        go.touch()
        wait_for(lambda: shim.status() == psutil.STATUS_ZOMBIE, "the job to exit")
    evs = wait_events(rt, 2)
    assert [(e.kind, e.step, e.exit_code) for e in evs] == \
        [(EventKind.CHECKPOINTED, 7, None), (EventKind.EXITED, None, 0)]
    assert job.CHECKPOINT_MARKER in [p.name for p in (tmp_path / "ck").iterdir()]


def test_ranks_from_the_environment(monkeypatch):
    for k, v in {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "PLINTH_ATTEMPT": "3",
                 "PLINTH_JOB_ID": "9"}.items():
        monkeypatch.setenv(k, v)
    assert (job.rank(), job.world_size(), job.local_rank(), job.attempt(), job.job_id()) == \
        (2, 4, 2, 3, 9)


def test_should_stop_after_sigterm():
    prog = ("import os, signal; from plinth import job\n"
            "assert not job.should_stop()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "assert job.should_stop()\n"
            "print('ok')")
    assert subprocess.run([PY, "-c", prog], capture_output=True, text=True, check=False).stdout == "ok\n"


def test_import_does_not_load_torch():
    prog = "import sys, plinth.job; print('torch' in sys.modules)"
    assert subprocess.run([PY, "-c", prog], capture_output=True, text=True, check=False).stdout == "False\n"

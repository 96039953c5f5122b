"""plinth.job: checkpoints, should_stop on SIGTERM, ranks; importable without torch."""

from __future__ import annotations

import subprocess

import pytest
from conftest import PY

from plinth import job


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
    assert [p.name for p in ckdir.iterdir()] == [job.CHECKPOINT_FILE]  # no temp files left


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

"""A Tune workload through a real `plinth up`: `plinth submit` of examples/tune/tiny.yaml (a
tiny model at two CPU shares, fewer trials); the scheduler places its tracker, servers and
clients as jobs (on 2 cores, share 2's server once share 1's is gone), and the records land for
each share in the database, where `plinth tune show` finds them. tests/tune/test_tune_e2e.py
runs the same through an in-process control plane, with a server killed mid-task."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from plinth_platform import run_cli as cli

pytest.importorskip("tvm")
EXAMPLE = Path(__file__).parents[2] / "examples" / "tune" / "tiny.yaml"


@pytest.mark.slow
def test_plinth_submit_tunes_at_two_shares_through_the_scheduler(platform, tmp_path,
                                                                 wait_for) -> None:
    from plinth.tune.db import listing, model_key

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc |= {"db": str(tmp_path / "db"), "trials": 2, "trials_per_iter": 2, "builder": "inline"}
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = cli(platform, "submit", str(spec))
    assert out.returncode == 0 and "Submitted Tune tiny" in out.stdout, out.stderr
    c = platform.client()
    def ended() -> bool:
        time.sleep(1)  # minutes of tuning: no need to ask the server twenty times a second
        return c.workload("tiny")["state"] != "active"
    wait_for(ended, 600, "the tuning to end")
    w = c.workload("tiny")
    assert w["state"] == "succeeded", w
    assert {u["unit"] for u in w["units"]} == {"tracker", "server-share-1-0", "server-share-2-0",
                                              "client-share-1-0", "client-share-2-0"}
    tuned = {(e.model, e.share) for e in listing(tmp_path / "db") if e.records >= 1}
    key = model_key(doc["model"], doc["input_shape"])
    assert tuned == {(key, 1.0), (key, 2.0)}
    show = cli(platform, "tune", "show", str(tmp_path / "db"))
    assert show.returncode == 0 and key in show.stdout
    ls = cli(platform, "ls", "--all")  # the task under the jobs, as services and FL tasks are
    row = next((line for line in ls.stdout.splitlines() if line.startswith("tiny ")), ls.stdout)
    assert "TUNE" in ls.stdout and "succeeded" in row and "1, 2 cores" in row and "2/2" in row

"""`plinth fl sim` end to end: a process pool of virtual clients, JSON, plots, kill and resume."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from plinth.cli.fl import app

APPS = Path(__file__).parent / "apps"
TINY = str(APPS / "tiny.yaml")


def test_sim_writes_json_and_plots(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["sim", TINY, "--clients", "4", "--rounds", "3", "--workers",
                                   "1", "--compression", "q8", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert [r["round"] for r in doc["rounds"]] == [1, 2, 3]
    for r in doc["rounds"]:
        assert set(r) >= {"round", "accuracy", "loss", "seconds", "bytes_up", "bytes_down"}
        assert r["updates"] == 4 and r["failures"] == 0
    assert len(doc["bytes_up"]) == len(doc["bytes_down"]) == 3
    assert doc["compression"] == "q8"
    # 8-bit updates: the upload is about a quarter of the download (the full float32 model)
    assert doc["bytes_up"][0] < 0.4 * doc["bytes_down"][0]
    assert doc["final_accuracy"] > 0.5  # digits, 3 rounds of 4 clients: far above chance (0.1)
    assert (tmp_path / "r" / "accuracy.png").stat().st_size > 1000


def test_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("code: tiny.py\nserver: {fraction: 2}\n")
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "sim", str(bad)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "server.fraction" in r.stderr


def _last_round(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as c:
            row = c.execute("SELECT max(round) FROM rounds").fetchone()
        return row[0] or 0
    except sqlite3.Error:
        return 0


def test_killed_sim_server_resumes_from_its_last_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "plinth.cli.main", "fl", "sim", TINY, "--clients", "4", "--workers", "1",
           "--checkpoint", str(ck)]
    p = subprocess.Popen([*cmd, "--rounds", "500"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _last_round(ck / "meta.sqlite") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the server and its client pool, mid-round
        p.wait()
    killed_at = _last_round(ck / "meta.sqlite")
    assert 2 <= killed_at < 500
    out = tmp_path / "r.json"
    r = subprocess.run([*cmd, "--rounds", str(killed_at + 2), "--resume", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [x["round"] for x in doc["rounds"]] == list(range(1, killed_at + 3))
    ran = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("round ")]
    assert ran == [str(killed_at + 1), str(killed_at + 2)]


def test_a_client_that_kills_its_worker_is_a_failure_and_the_pool_recovers(tmp_path):
    app_yaml = tmp_path / "crashy.yaml"
    app_yaml.write_text((APPS / "tiny.yaml").read_text().replace(
        "code: tiny.py", f"code: {APPS / 'crashy.py'}"))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["sim", str(app_yaml), "--clients", "3", "--rounds", "2",
                                   "--workers", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rounds = json.loads(out.read_text())["rounds"]
    assert rounds[0]["failures"] >= 1 and rounds[0]["updates"] + rounds[0]["failures"] == 3
    assert rounds[1]["updates"] == 3 and rounds[1]["failures"] == 0

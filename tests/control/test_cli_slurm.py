"""What Slurm and kubectl users expect of the CLI: submit --wait, ls filters and output
formats, 80 columns, --version, restart events and the recovery line, specs run from anywhere.
`ls` and the restart run on a control plane in virtual time (virtual.py; the CLI over real HTTP:
virtual_http.py); what needs a job to run or to wait for, on a real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from plinth_platform import run_cli as cli
from virtual import VirtualPlatform
from virtual_http import served

import plinth
from plinth.runtime.sim_behaviour import SimBehaviour

REPO = Path(__file__).resolve().parents[2]


def test_version() -> None:
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "--version"],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"plinth {plinth.__version__}"


def test_submit_wait_exits_with_the_jobs_exit_code(shared_platform, tmp_path) -> None:
    ok, bad = tmp_path / "ok.yaml", tmp_path / "bad.yaml"
    ok.write_text("name: ok\ncommand: [\"true\"]\n")
    bad.write_text("name: bad\ncommand: exit 7\n")
    r = cli(shared_platform, "submit", "--wait", str(ok))
    assert r.returncode == 0 and "succeeded" in r.stdout, r.stdout + r.stderr
    r = cli(shared_platform, "submit", "--wait", str(ok), str(bad))
    assert r.returncode == 7 and "failed" in r.stdout, r.stdout + r.stderr


def ids(table: str) -> list[int]:
    return [int(line.split()[0]) for line in table.splitlines()[1:]
            if line.split() and line.split()[0].isdigit()]


def test_ls_filters_and_formats(vp) -> None:
    vp.behave("fmt-run", SimBehaviour(exit_at=300.0))
    with vp.client() as c:
        c.set_tenant("fmt")
        with vp.client(c.add_token("fmt")) as t:
            done = t.submit({"name": "fmt-done", "command": ["true"]})
            vp.run_until(lambda: t.job(done)["state"] == "succeeded", limit_s=30)
            run = t.submit({"name": "fmt-run", "command": "sleep 300"})
            vp.step()
            assert t.job(run)["state"] == "running"
    with served(vp) as api:
        r = cli(api, "ls", "--tenant", "fmt", "-o", "json")
        assert [j["id"] for j in json.loads(r.stdout)] == [run]  # active only by default
        r = cli(api, "ls", "-a", "--tenant", "fmt", "-o", "yaml")
        assert sorted(j["id"] for j in yaml.safe_load(r.stdout)) == [done, run]
        r = cli(api, "ls", "--tenant", "fmt", "--state", "succeeded,pending")
        assert ids(r.stdout) == [done]
        r = cli(api, "ls", "-a", "--tenant", "fmt", "--name", "fmt-run", "-o", "wide")
        head = r.stdout.splitlines()[0].split()
        assert "ATTEMPT" in head and "SUBMITTED" in head and ids(r.stdout) == [run]
        # in an 80-column terminal -o wide is wider than 80, not cut to "SUBM…"
        r = cli(api, "ls", "-a", "--tenant", "fmt", "-o", "wide", columns=80)
        head = r.stdout.splitlines()[0].split()
        assert head[-2:] == ["SUBMITTED", "REASON"] and "…" not in r.stdout, r.stdout
        assert sorted(ids(r.stdout)) == [done, run]
        r = cli(api, "ls", "-o", "xml")
        assert r.returncode == 2 and "--output" in r.stderr


def test_ls_fits_80_columns(shared_platform) -> None:
    with shared_platform.client() as c:
        # a failed job with a long reason: its command is not there
        j = c.submit({"name": "a-rather-long-job-name-indeed", "command": ["no-such-" + "x" * 200]})
        c.wait(j, timeout=60)
        assert len(c.job(j)["reason"]) > 200
    r = cli(shared_platform, "ls", "-a", columns=80)
    assert r.returncode == 0 and r.stdout.strip()
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
    rows = [line for line in r.stdout.splitlines() if line.lstrip().startswith(str(j))]
    assert len(rows) == 1  # one line per job: the reason is cut, not wrapped


def test_restart_is_in_the_history_and_summed_up(tmp_path) -> None:
    with VirtualPlatform(tmp_path) as vp:
        assert vp.cp.recovery.summary() == "recovered: no unfinished jobs"  # the first start
        vp.behave("survivor", SimBehaviour(exit_at=30.0))
        with vp.client() as c:
            j = c.submit({"name": "survivor", "command": "sleep 30"})
            vp.step()
        vp.restart(down_s=5)
        with vp.client() as c:
            kinds = [e["kind"] for e in c.job(j)["events"]]
            assert kinds == ["submitted", "started", "re-adopted"]
            assert vp.cp.recovery.summary() == "recovered 1 running re-adopted"
            vp.run_until(lambda: c.job(j)["state"] == "succeeded", limit_s=60)
            assert c.job(j)["end_time"] - c.job(j)["start_time"] == 30.0


def test_a_spec_runs_from_any_directory(shared_platform, tmp_path) -> None:
    """`plinth submit examples/jobs/x.yaml` and `plinth submit x.yaml` from examples/jobs both
    find the script next to the spec."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "hello.py").write_text("print('hello from beside the spec')\n")
    (folder / "job.yaml").write_text('name: beside\ncommand: ["python", "hello.py"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "COLUMNS": "200", "PLINTH_SERVER": shared_platform.url,
           "PLINTH_TOKEN": shared_platform.token}
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "submit", "--wait",
                        str(folder / "job.yaml")], cwd=elsewhere, env=env, capture_output=True,
                       text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    job = int(r.stdout.split()[2])
    with shared_platform.client() as c:
        assert "hello from beside the spec" in c.logs(job)

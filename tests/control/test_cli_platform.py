"""The platform CLI as a user runs it: real `plinth` subprocesses, against a real server where
a job runs, else against a control plane in virtual time behind real HTTP (virtual_http.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from virtual_http import served


def plinth(platform, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PLINTH_SERVER": platform.url,
           "PLINTH_TOKEN": token or platform.token}
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", *args], check=False,
                          capture_output=True,
                          text=True, timeout=120, env=env)


def test_submit_ls_show_logs_cancel(shared_platform, tmp_path, wait_for) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cli-job\ncommand: echo from-the-cli; sleep 300\n"
                    "resources: {cpus: 0.1, memory: 1Gi, gpus: 1}\n")
    r = plinth(shared_platform, "submit", str(spec))
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[2]
    assert r.stdout.startswith(f"Submitted job {job}")
    with shared_platform.client() as c:
        wait_for(lambda: "from-the-cli" in c.logs(int(job)), what="the job's output")
        assert c.job(int(job))["state"] == "running"
    r = plinth(shared_platform, "ls")
    assert r.returncode == 0 and "cli-job" in r.stdout and "running" in r.stdout
    assert r.stdout.splitlines()[0].split()[:4] == ["JOBID", "NAME", "TENANT", "STATE"]
    r = plinth(shared_platform, "show", job)
    assert r.returncode == 0 and "events" in r.stdout and "started" in r.stdout
    assert "allocation" in r.stdout and "worker 0" in r.stdout
    r = plinth(shared_platform, "logs", job)
    assert "from-the-cli" in r.stdout
    r = plinth(shared_platform, "nodes")
    assert r.returncode == 0 and "A100" in r.stdout and job in r.stdout
    r = plinth(shared_platform, "top", "--iterations", "1")
    assert r.returncode == 0 and "cli-job" in r.stdout and "policy drf" in r.stdout
    r = plinth(shared_platform, "cancel", job)
    assert r.returncode == 0 and f"job {job}: stopping" in r.stdout
    r = plinth(shared_platform, "logs", "-f", job)  # returns once the job has finished
    assert r.returncode == 0 and "from-the-cli" in r.stdout
    r = plinth(shared_platform, "ls", "--all")
    assert "cancelled" in r.stdout


def test_cli_errors_are_one_line(vp, tmp_path) -> None:
    with served(vp) as api:
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: x\ncommand: [true]\nresources: {gpus: -2}\n")
        r = plinth(api, "submit", str(bad))
        assert r.returncode == 2 and r.stderr.count("\n") == 1
        assert "resources.gpus: must be >= 0" in r.stderr and str(bad) in r.stderr
        r = plinth(api, "show", "999999")
        assert r.returncode == 2 and "job 999999 not found" in r.stderr
        r = plinth(api, "ls", token="not-a-token")
        assert r.returncode == 2 and "unknown API token" in r.stderr
        env = {**os.environ, "PLINTH_SERVER": "127.0.0.1:1", "PLINTH_TOKEN": "x"}
        r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "ls"], check=False,
                           capture_output=True,
                           text=True, timeout=60, env=env)
        assert r.returncode == 2 and "cannot reach the control plane" in r.stderr


def test_tenant_commands(vp) -> None:
    with served(vp) as api:
        r = plinth(api, "tenant", "set", "vision", "--gpus", "2")
        assert r.returncode == 0, r.stderr
        r = plinth(api, "tenant", "token", "vision")
        token = r.stdout.strip()
        assert r.returncode == 0 and token.startswith("plt_")
        r = plinth(api, "tenant", "ls")
        assert "vision" in r.stdout
        r = plinth(api, "tenant", "ls", token=token)
        assert r.returncode == 2 and "admin" in r.stderr
        r = plinth(api, "tenant", "set", "Bad_Name")
        assert r.returncode == 2 and "tenant" in r.stderr


def test_up_reports_bad_options_in_one_line(tmp_path) -> None:
    import socket

    def up(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "plinth.cli.main", "up", "--home",
                               str(tmp_path / "home"), *args], check=False, capture_output=True,
                              text=True,
                              timeout=60)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = up("--port", str(s.getsockname()[1]), "--fake-gpus", "2xA100")
    assert r.returncode == 2 and "--port: cannot listen" in r.stderr
    r = up("--port", "0", "--fake-gpus", "2xZ100")
    assert r.returncode == 2 and "--fake-gpus" in r.stderr and "Z100" in r.stderr
    r = up("--port", "0", "--fake-gpus", "2xA100", "--policy", "nosuch")
    assert r.returncode == 2 and "'nosuch'" in r.stderr and "gavel" in r.stderr

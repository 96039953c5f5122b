"""`plinth quickstart` (what `make run` does): start the platform, submit the bundled examples,
watch them run and finish, then stop the platform."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live

from plinth.cli.platform import console, jobs_table, nodes_table
from plinth.client import Client
from plinth.sched.lifecycle import State
from plinth.core.errors import PlinthError
from plinth.core.net import free_port

EXAMPLES = ("train.yaml", "gang.yaml", "fraction.yaml")


def start_server(home: Path, port: int, *extra: str, log: Path | None = None
                 ) -> subprocess.Popen:
    """`plinth up` as a child process; returns once its API answers."""
    log = log or home / "server.log"
    home.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab")  # noqa: SIM115 -- handed to the child, closed with it
    proc = subprocess.Popen([sys.executable, "-m", "plinth.cli.main", "up", "--home", str(home),
                             "--port", str(port), *extra], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    with Client(url, token="-") as c:
        while True:
            try:
                c.health()
                return proc
            except PlinthError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
                    raise PlinthError(f"the control plane did not start: {tail[0]}") from None
                time.sleep(0.1)


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_jobs(home: Path) -> None:
    """Kill the jobs of the platform whose state is in `home`. Jobs outlive their control plane
    by design (a restart adopts them); tests and benchmarks must not leave theirs behind."""
    import psutil

    for proc in psutil.process_iter(["environ"]):
        env = proc.info.get("environ") or {}
        if env.get("PLINTH_CHECKPOINT_DIR", "").startswith(str(home)):
            try:
                proc.kill()
            except psutil.Error:
                pass


def quickstart(
    home: Annotated[Path, typer.Option(help="State directory for this run (wiped first).")]
    = Path("results/quickstart"),
    examples: Annotated[Path, typer.Option(help="Folder with the example job specs.")]
    = Path("examples/jobs"),
    fake_gpus: Annotated[str | None, typer.Option(help="Virtual GPUs where NVML finds none.")]
    = "4xA100",
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 600.0,
) -> None:
    """Start the platform, submit the bundled examples, and watch them run and finish."""
    from plinth.runtime.gpu import discover_gpus

    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    extra = [] if discover_gpus() else ["--fake-gpus", fake_gpus or "4xA100"]
    port = free_port()
    console.print(f"starting the control plane: plinth up --home {home} --port {port} "
                  f"{' '.join(extra)}", highlight=False)
    proc = start_server(home.resolve(), port, *extra)
    token = (home / "token").read_text().strip()
    failed = False
    try:
        with Client(f"127.0.0.1:{port}", token) as c:
            h = c.health()
            console.print(f"up: {h['gpus']} GPUs, policy {h['policy']}, isolation "
                          f"{h['isolation']}", highlight=False)
            ids = []
            for name in EXAMPLES:
                job = c.submit(examples / name)
                ids.append(job)
                console.print(f"plinth submit {examples / name}  ->  job {job}", highlight=False)
            deadline = time.monotonic() + timeout
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    jobs = [c.job(j) for j in ids]
                    live.update(jobs_table(jobs), refresh=True)
                    if all(State(j["state"]).terminal for j in jobs):
                        break
                    if time.monotonic() > deadline:
                        raise PlinthError(f"examples still running after {timeout:g} s")
                    time.sleep(0.5)
            console.print()
            console.print(nodes_table(c.nodes()))
            for j in jobs:
                tail = [ln for ln in c.logs(j["id"]).splitlines()
                        if ln.strip() and not ln.startswith("=== plinth")][-2:]
                console.print(f"[bold]job {j['id']} {j['name']}[/] {j['state']}: "
                              + " | ".join(tail), highlight=False)
                failed |= j["state"] != State.SUCCEEDED.value
    finally:
        stop_server(proc)
    console.print(f"control plane stopped; its store is {home / 'plinth.db'}, logs in "
                  f"{home / 'logs'}", highlight=False)
    if failed:
        raise typer.Exit(1)


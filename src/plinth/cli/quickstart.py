"""`plinth quickstart` (what `make run` does): start the platform, submit the bundled examples
(a job, a gang, a fractional-GPU job, and a service that gets requests all the while), watch
them run and finish, then stop the platform."""

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

from rich.console import Group

from plinth.cli.platform import console, jobs_table, nodes_table, services_table
from plinth.client import Client
from plinth.sched.lifecycle import State
from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.serve.loadgen import ClosedLoop

EXAMPLES = ("train.yaml", "gang.yaml", "fraction.yaml")
SERVICE = Path("examples/serve/service.yaml")
IMAGE = '{"inputs": [[[' + ",".join(["[" + ",".join(["0.5"] * 28) + "]"] * 28) + "]]]}"


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
    shutil.rmtree(home.with_name(home.name + "-jobs"), ignore_errors=True)  # as root: theirs
    home.mkdir(parents=True)
    extra = [] if discover_gpus() else ["--fake-gpus", fake_gpus or "4xA100"]
    port = free_port()
    extra += ["--serve-port", str(free_port()), "--serve-tick", "2"]
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
            w = c.submit_workload(SERVICE)  # first: its replica takes its CPUs before the jobs
            console.print(f"plinth submit {SERVICE}  ->  Service {w['name']} at "
                          f"{w['status']['url']}", highlight=False)
            deadline = time.monotonic() + timeout
            ids = []
            for name in EXAMPLES:
                job = c.submit(examples / name)
                ids.append(job)
                console.print(f"plinth submit {examples / name}  ->  job {job}", highlight=False)
            while not c.workload(w["name"])["status"].get("ready"):  # then send it requests
                if time.monotonic() > deadline:
                    raise PlinthError(f"service {w['name']} not serving after {timeout:g} s")
                time.sleep(0.2)
            load = ClosedLoop(w["status"]["url"], IMAGE, clients=4).start()
            try:
                with Live(console=console, auto_refresh=False) as live:
                    while True:
                        jobs = [c.job(j) for j in ids]
                        svc = c.workload(w["name"])
                        served = f"requests answered: {load.codes}"
                        live.update(Group(jobs_table(jobs), "", services_table([svc]), served),
                                    refresh=True)
                        if all(State(j["state"]).terminal for j in jobs):
                            break
                        if time.monotonic() > deadline:
                            raise PlinthError(f"examples still running after {timeout:g} s")
                        time.sleep(0.5)
            finally:
                load.stop()
            c.cancel_workload(w["name"])
            ok = load.codes.get(200, 0)
            lost = {k: n for k, n in load.codes.items() if k not in (200, 503)}
            console.print(f"[bold]service {w['name']}[/]: {ok} requests answered, p99 "
                          f"{load.p99_ms():.1f} ms (SLO {svc['status']['slo_ms']:g} ms), "
                          f"{svc['status']['desired']} replicas at the end"
                          + (f"; failed: {lost}" if lost else ""), highlight=False)
            failed |= ok == 0 or bool(lost)
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


"""`plinth quickstart` (what `make run` does): start the platform, submit the bundled examples
(a job, a gang, a fractional-GPU job, a service that gets requests all the while, an FL task
and a tuning task), watch them run and finish, then stop the platform."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.live import Live

from plinth.cli.platform import connect, console, jobs_table
from plinth.cli.tables import fl_table, nodes_table, services_table
from plinth.cli.tune import tune_table
from plinth.core.errors import PlinthError
from plinth.core.lifecycle import State
from plinth.core.net import free_port

if TYPE_CHECKING:
    from plinth.client import Client

EXAMPLES = ("train.yaml", "gang.yaml", "fraction.yaml")
SERVICE = Path("examples/serve/service.yaml")
FL_TASK = Path("examples/fl/task.yaml")
TUNE = Path("examples/tune/tiny.yaml")  # run at one share, with fewer trials, to keep it short
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
    with connect(url, "-") as c:
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


def kill_jobs(home: Path, jobs_dir: Path | None = None) -> None:
    """Kill the jobs of the platform whose state is in `home` (their folders in `home`, its
    `-jobs` sibling or `jobs_dir`), and the shims that run them. Jobs outlive their control
    plane by design (a restart adopts them); tests and benchmarks must not leave theirs
    behind."""
    import psutil

    roots = (str(home), *([str(jobs_dir)] if jobs_dir is not None else []))
    for proc in psutil.process_iter(["environ", "cmdline"]):
        env, cmd = proc.info.get("environ") or {}, proc.info.get("cmdline") or []
        shim = len(cmd) > 3 and cmd[2].endswith("runtime/shim.py") and cmd[-1].startswith(roots)
        if shim or env.get("PLINTH_CHECKPOINT_DIR", "").startswith(roots):
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
    from plinth.serve.loadgen import ClosedLoop

    shutil.rmtree(home, ignore_errors=True)
    for other in ("-jobs", "-files"):  # as root: the tenants' folders, and what it hands them
        shutil.rmtree(home.with_name(home.name + other), ignore_errors=True)
    home.mkdir(parents=True)
    extra = [] if discover_gpus() else ["--fake-gpus", fake_gpus or "4xA100"]
    port = free_port()
    extra += ["--serve-tick", "2"]
    console.print(f"starting the control plane: plinth up --home {home} --port {port} "
                  f"{' '.join(extra)}", highlight=False)
    proc = start_server(home.resolve(), port, *extra)
    token = (home / "token").read_text().strip()
    failed = False
    try:
        with connect(f"127.0.0.1:{port}", token) as c:
            h = c.health()
            console.print(f"up: {h['gpus']} GPUs, policy {h['policy']}, isolation "
                          f"{h['isolation']}", highlight=False)
            w = c.submit_workload(SERVICE)  # first: its units take their CPUs before the jobs
            console.print(f"plinth submit {SERVICE}  ->  Service {w['name']}", highlight=False)
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
            w = c.workload(w["name"])  # its router has reported where it listens
            console.print(f"Service {w['name']} answers at {w['status']['url']}",
                          highlight=False)
            task, fl_clients = submit_fl_task(c, home)
            console.print(f"plinth submit {FL_TASK}  ->  FLTask {task['name']}; its clients "
                          f"ask the control plane where its server listens (plinth fl client "
                          f"--task {task['name']})", highlight=False)
            tune = submit_tune(c, home)
            console.print(f"plinth submit {TUNE}  ->  Tune {tune['name']}, records into "
                          f"{tune['status']['db']}", highlight=False)
            load = ClosedLoop(w["status"]["url"], IMAGE, clients=4).start()
            try:
                with Live(console=console, auto_refresh=False) as live:
                    while True:
                        jobs = [c.job(j) for j in ids]
                        svc, fl = c.workload(w["name"]), c.workload(task["name"])
                        tuning = c.workload(tune["name"])
                        served = f"requests answered: {load.codes}"
                        live.update(Group(jobs_table(jobs), "", services_table([svc]), served,
                                          "", fl_table([fl]), "", tune_table([tuning])),
                                    refresh=True)
                        if all(State(j["state"]).terminal for j in jobs) and \
                                fl["state"] != "active" and tuning["state"] != "active":
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
            for t in fl_clients:
                t.join(60)
            last = (fl["status"].get("per_round") or [{"accuracy": None}])[-1]
            console.print(f"[bold]FL task {fl['name']}[/]: {fl['state']} after round "
                          f"{fl['status'].get('round', 0)}, accuracy {last['accuracy']}",
                          highlight=False)
            failed |= fl["state"] != "succeeded"
            console.print(f"[bold]Tune {tuning['name']}[/]: {tuning['state']}; what is tuned: "
                          f"plinth tune show {tuning['status']['db']}", highlight=False)
            failed |= tuning["state"] != "succeeded"
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


def submit_fl_task(c: Client, home: Path) -> tuple[dict, list[threading.Thread]]:
    """Submit the example FL task with a fresh tokens file, and play its data owners: each
    client joins the task's server over gRPC with its own token (on threads of this process,
    as remote parties would from their own machines)."""
    from plinth.core.spec import load_spec
    from plinth.fl.deploy import run_clients
    from plinth.fl.transport.certs import write_tokens
    from plinth.fl.workload import client_address

    spec = load_spec(FL_TASK)
    n = spec.data.clients
    tokens = write_tokens(handed(home) / "fl-tokens.txt", [str(i) for i in range(n)])
    _give(c, tokens)
    spec = spec.model_copy(update={"transport": spec.transport.model_copy(
        update={"tokens": str(tokens)})})
    task = c.submit_workload(spec, base=FL_TASK.parent)
    lines = [line.split() for line in tokens.read_text().splitlines()]
    def locate(cid: int) -> str | None:  # the server's address, once it has reported it
        return client_address(c.workload(task["name"])["status"], cid)

    threads = [threading.Thread(target=run_clients, args=(str(FL_TASK),), daemon=True,
                                kwargs={"locate": locate, "cids": [int(cid)], "clients": n,
                                        "tokens": {int(cid): token}})
               for cid, token in lines]
    for t in threads:
        t.start()
    return task, threads



def handed(home: Path) -> Path:
    """The folder, next to `home`, of what this run hands the `default` tenant's units (the FL
    clients' tokens, the tuning database). Not `home` itself: as root, the units run as the
    tenant's own user, who cannot enter the server's home (0700)."""
    d = home.resolve().with_name(home.name + "-files")
    d.mkdir(mode=0o755, exist_ok=True)
    return d


def _give(c: Client, path: Path) -> None:
    """Hand `path` to the `default` tenant's Unix user, as that tenant would have made it
    itself (a root control plane runs its units as that user); nothing when there is none."""
    import pwd

    user = next((t["user"] for t in c.tenants() if t["name"] == "default"), None)
    if user is not None:
        p = pwd.getpwnam(user)
        os.chown(path, p.pw_uid, p.pw_gid)


def submit_tune(c: Client, home: Path) -> dict:
    """Submit the example Tune task at its first share only, with 4 trials, its database in
    `home` (the whole example tunes at two shares: `plinth submit examples/tune/tiny.yaml`)."""
    from plinth.core.spec import load_spec

    spec = load_spec(TUNE)
    db = handed(home) / "tune-db"
    db.mkdir()
    _give(c, db)
    spec = spec.model_copy(update={"shares": spec.shares[:1], "trials": 4, "trials_per_iter": 4,
                                   "builder": "inline", "db": str(db)})
    return c.submit_workload(spec, base=TUNE.parent)

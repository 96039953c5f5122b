"""Platform commands: up, submit, ls, show, logs, cancel, nodes, top, tenant."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from plinth.client import Client, plinth_home
from plinth.core.errors import PlinthError

console = Console()

Server = Annotated[str | None, typer.Option("--server", envvar="PLINTH_SERVER",
                                           help="Control plane URL [default: 127.0.0.1:8642].")]
Token = Annotated[str | None, typer.Option("--token", envvar="PLINTH_TOKEN",
                                          help="API token [default: $PLINTH_HOME/token].")]

STATE_STYLE = {"pending": "yellow", "running": "green", "stopping": "magenta",
               "succeeded": "bold green", "failed": "red", "cancelled": "dim", "timeout": "red"}


def up(
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless told otherwise.")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port for the REST API.")] = 8642,
    home: Annotated[Path | None, typer.Option(envvar="PLINTH_HOME",
                                              help="State directory [default: ~/.plinth].")] = None,
    db: Annotated[str | None, typer.Option(help="SQLAlchemy URL, e.g. postgresql://u@host/db "
                                                "[default: SQLite at $PLINTH_HOME/plinth.db].")]
    = None,
    fake_gpus: Annotated[str | None, typer.Option(help="Declare virtual GPUs, e.g. 4xA100 or "
                                                       "2xA100,2xV100 (one node per model), "
                                                       "where NVML finds none.")] = None,
    policy: Annotated[str, typer.Option(help="Scheduling policy: fifo, sjf, priority, drf, "
                                             "tiresias, themis, gavel.")] = "drf",
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
    min_runtime: Annotated[float, typer.Option(help="Seconds a job runs before it may be "
                                                    "preempted.")] = 30.0,
    round_s: Annotated[float, typer.Option("--round", help="Lease length in seconds for the "
                                                          "round-based policies (gavel, "
                                                          "themis).")] = 360.0,
) -> None:
    """Start the control plane: store, local runtime, scheduler and REST API (foreground)."""
    from plinth.control.server import ServerConfig, serve

    cfg = ServerConfig(home=(home or plinth_home()).expanduser(), host=host, port=port, db=db,
                       fake_gpus=fake_gpus, policy=policy, grace_s=grace,
                       min_runtime_s=min_runtime, round_s=round_s)
    serve(cfg, announce=lambda s: console.print(s, highlight=False, soft_wrap=True))


def submit(specs: Annotated[list[Path], typer.Argument(help="Job spec YAML files.")],
           server: Server = None, token: Token = None) -> None:
    """Submit jobs; prints each job's id."""
    from plinth.control.spec import job_to_run
    from plinth.core.spec import load_spec

    jobs = [job_to_run(load_spec(path), str(path)) for path in specs]  # all checked, then sent
    with Client(server, token) as c:
        for path, job in zip(specs, jobs):
            job_id = c.submit(job)
            console.print(f"Submitted job {job_id} ({path})", highlight=False)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def jobs_table(jobs: list[dict], now: float | None = None) -> Table:
    now = now or time.time()
    t = Table(box=None, header_style="bold")
    for col in ("JOBID", "NAME", "TENANT", "STATE", "TIME", "GPUS", "WORKERS", "REASON"):
        t.add_column(col, justify="right" if col in ("JOBID", "TIME", "GPUS", "WORKERS") else
                     "left", overflow="fold" if col == "REASON" else "ellipsis")
    for j in sorted(jobs, key=lambda j: j["id"]):
        running = j["start_time"] if j["state"] in ("running", "stopping") else None
        elapsed = (now - running) if running else (
            (j["end_time"] - j["start_time"]) if j["end_time"] and j["start_time"] else None)
        reason = j["reason"] if j["state"] in ("pending", "stopping", "failed", "timeout") else ""
        t.add_row(str(j["id"]), j["name"], j["tenant"],
                  f"[{STATE_STYLE.get(j['state'], '')}]{j['state']}[/]", _age(elapsed),
                  f"{j['gpus']:g}", str(j["workers"]), reason)
    return t


def ls(all: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
       tenant: Annotated[str | None, typer.Option("--tenant", "-t")] = None,
       server: Server = None, token: Token = None) -> None:
    """The queue, as squeue shows it: pending, running and stopping jobs (all with --all)."""
    with Client(server, token) as c:
        console.print(jobs_table(c.jobs(all=all, tenant=tenant)))


def show(job: int, server: Server = None, token: Token = None) -> None:
    """A job's spec, allocation, events, and why it is pending."""
    import yaml

    with Client(server, token) as c:
        j = c.job(job)
    console.print(f"[bold]job {j['id']}[/] {j['name']}  tenant {j['tenant']}  state "
                  f"[{STATE_STYLE.get(j['state'], '')}]{j['state']}[/]  attempt {j['attempt']}  "
                  f"preemptions {j['preemptions']}", highlight=False)
    if j["state"] == "pending":
        console.print(f"[yellow]why pending:[/] {j['reason']}", highlight=False)
    elif j["reason"]:
        console.print(f"reason: {j['reason']}", highlight=False)
    if j["exit_code"] is not None:
        console.print(f"exit code: {j['exit_code']}")
    if j.get("checkpoint_step") is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["checkpoint_time"]))
        console.print(f"last checkpoint: step {j['checkpoint_step']} at {when}", highlight=False)
    console.print("[bold]spec[/]")
    console.print(yaml.safe_dump(j["spec"], sort_keys=False).rstrip(), highlight=False)
    if j["allocation"]:
        console.print("[bold]allocation[/]")
        for rank, s in enumerate(j["allocation"]["slots"]):
            console.print(f"  worker {rank}: node {s.get('node_name') or s['node']}, "
                          f"GPUs {s['gpus']}, share "
                          f"{s['milli'] / 1000:g}"
                          + (f", GPU memory {s['gpu_memory_mib']} MiB" if s["gpu_memory_mib"]
                             else ""), highlight=False)
    console.print("[bold]events[/]")
    for e in j["events"]:
        stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        console.print(f"  {stamp}  {e['kind']:<14} {e['message']}", highlight=False)


def logs(job: int, follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
         server: Server = None, token: Token = None) -> None:
    """Print a job's log (all attempts); -f follows it until the job finishes."""
    with Client(server, token) as c:
        if follow:
            for chunk in c.follow(job):
                typer.echo(chunk, nl=False)
        else:
            typer.echo(c.logs(job), nl=False)


def cancel(jobs: Annotated[list[int], typer.Argument(help="Job ids.")],
           server: Server = None, token: Token = None) -> None:
    """Cancel jobs: a pending job at once, a running one with SIGTERM, then SIGKILL."""
    failed = False
    with Client(server, token) as c:
        for job in jobs:
            try:
                console.print(f"job {job}: {c.cancel(job)}", highlight=False)
            except PlinthError as e:
                console.print(f"[red]job {job}:[/] {e}", highlight=False)
                failed = True
    if failed:
        raise typer.Exit(1)


def nodes_table(nodes: list[dict]) -> Table:
    t = Table(box=None, header_style="bold")
    for col in ("NODE", "GPU", "GPUS", "GPU SHARES FREE", "CPUS", "MEMORY", "JOBS"):
        t.add_column(col)
    for n in nodes:
        shares = " ".join(f"{m / 1000:.2f}" for m in n["gpu_free_milli"])
        t.add_row(n["name"], n["gpu_model"] or "-", f"{n['gpus_used']:g}/{n['gpus']}", shares,
                  f"{n['cpus_used']:g}/{n['cpus']:g}",
                  f"{n['memory_used_mib'] / 1024:.1f}/{n['memory_mib'] / 1024:.1f} GiB",
                  ",".join(map(str, n["running"])) or "-")
    return t


def nodes(server: Server = None, token: Token = None) -> None:
    """Nodes, their GPUs and what is allocated on them."""
    with Client(server, token) as c:
        console.print(nodes_table(c.nodes()))


def top(interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
        iterations: Annotated[int, typer.Option(help="Stop after this many frames "
                                                     "(0: until Ctrl-C).")] = 0,
        server: Server = None, token: Token = None) -> None:
    """A live view of nodes and jobs."""
    with Client(server, token) as c:
        def frame() -> Group:
            h = c.health()
            jobs = c.jobs(all=False)
            head = (f"[bold]plinth[/] {c.server}  policy {h['policy']}  {h['gpus']} GPUs  "
                    f"isolation {h['isolation']}  "
                    f"{sum(j['state'] == 'running' for j in jobs)} running  "
                    f"{sum(j['state'] == 'pending' for j in jobs)} pending")
            return Group(head, nodes_table(c.nodes()), jobs_table(jobs))

        n = 0
        with Live(frame(), console=console, auto_refresh=False) as live:
            while True:
                n += 1
                if iterations and n >= iterations:
                    break
                time.sleep(interval)
                live.update(frame(), refresh=True)


tenant_app = typer.Typer(help="Tenants, their GPU quotas and their API tokens (admin).",
                         no_args_is_help=True)


@tenant_app.command("set")
def tenant_set(name: str,
               gpus: Annotated[float | None, typer.Option(help="Nominal GPU quota.")] = None,
               borrowing_limit: Annotated[float | None, typer.Option()] = None,
               server: Server = None, token: Token = None) -> None:
    """Create a tenant or change its quota."""
    with Client(server, token) as c:
        c.set_tenant(name, gpus, borrowing_limit)
        console.print(f"tenant {name}: quota {gpus if gpus is not None else 'equal share'} GPUs",
                      highlight=False)


@tenant_app.command("token")
def tenant_token(name: str, server: Server = None, token: Token = None) -> None:
    """Create an API token for a tenant and print it (it is not shown again)."""
    with Client(server, token) as c:
        typer.echo(c.add_token(name))


@tenant_app.command("ls")
def tenant_ls(server: Server = None, token: Token = None) -> None:
    """List tenants and their quotas."""
    with Client(server, token) as c:
        t = Table("TENANT", "GPUS", "BORROWING LIMIT", box=None, header_style="bold")
        for row in c.tenants():
            t.add_row(row["name"], "equal share" if row["gpus"] is None else f"{row['gpus']:g}",
                      "-" if row["borrowing_limit"] is None else f"{row['borrowing_limit']:g}")
        console.print(t)


"""Platform commands: up, submit, ls, show, logs, cancel, nodes, top, tenant."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from plinth.cli.tables import fl_table, nodes_table, services_table
from plinth.cli.tables import ms as _ms
from plinth.core.errors import PlinthError

if TYPE_CHECKING:
    from plinth.client import Client

console = Console()

Server = Annotated[str | None, typer.Option("--server", envvar="PLINTH_SERVER",
                                           help="Control plane URL (default: 127.0.0.1:8642).")]
Token = Annotated[str | None, typer.Option("--token", envvar="PLINTH_TOKEN",
                                          help="API token (default: $PLINTH_HOME/token).")]


def connect(server: str | None, token: str | None) -> Client:
    """The control plane's client, as every command that talks to it opens it. The client (httpx,
    the spec models) is imported here, when a command runs, so that `--help` stays quick."""
    from plinth.client import Client

    return Client(server, token)


STATE_STYLE = {"pending": "yellow", "running": "green", "stopping": "magenta",
               "succeeded": "bold green", "failed": "red", "cancelled": "dim", "timeout": "red"}


def up(
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless told otherwise.")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port for the REST API.")] = 8642,
    home: Annotated[Path | None, typer.Option(envvar="PLINTH_HOME",
                                              help="State directory (default: ~/.plinth).")] = None,
    db: Annotated[str | None, typer.Option(help="SQLAlchemy URL, e.g. postgresql://u@host/db "
                                                "[default: SQLite at $PLINTH_HOME/plinth.db].")]
    = None,
    fake_gpus: Annotated[str | None, typer.Option(help="Declare virtual GPUs, e.g. 4xA100 or "
                                                       "2xA100,2xV100 (one node per model), "
                                                       "where NVML finds none.")] = None,
    runtime: Annotated[str, typer.Option(help="Where jobs run: local (this machine) or ray "
                                              "(a Ray cluster, see --ray-address).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="With --runtime ray: the Ray head, "
                                                         "HOST:PORT or auto.")] = None,
    fence_after: Annotated[float, typer.Option(
        help="With --runtime ray: seconds a node's jobs keep running while the node cannot "
             "reach the Ray head; then they are killed there (0: never). Keep it under the "
             "head's health-check window (health_check_period_ms x "
             "health_check_failure_threshold), after which they are requeued elsewhere.")]
    = 10.0,
    policy: Annotated[str, typer.Option(help="Scheduling policy: fifo, sjf, priority, drf, "
                                             "tiresias, themis, gavel.")] = "drf",
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
    min_runtime: Annotated[float, typer.Option(help="Seconds a job runs before it may be "
                                                    "preempted.")] = 30.0,
    round_s: Annotated[float, typer.Option("--round", help="Lease length in seconds for the "
                                                          "round-based policies (gavel, "
                                                          "themis).")] = 360.0,
    max_body: Annotated[int, typer.Option(help="Largest request body in bytes; larger ones "
                                               "are answered 413.")] = 1 << 20,
    tls_cert: Annotated[Path | None, typer.Option(help="Serve HTTPS with this certificate "
                                                       "(PEM).")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The certificate's private key "
                                                      "(PEM).")] = None,
    jobs_dir: Annotated[Path | None, typer.Option(
        help="As root, where each tenant's jobs keep their checkpoints, in a folder of the "
             "tenant's own Unix user [default: $PLINTH_HOME-jobs].")] = None,
    serve_policy: Annotated[str, typer.Option(help="Autoscaling policy for services: "
                                                   "faro-fairsum, aiad, ... (plinth serve "
                                                   "policies).")] = "faro-fairsum",
    serve_tick: Annotated[float, typer.Option(help="Seconds between autoscaling "
                                                   "decisions.")] = 10.0,
    serve_minute: Annotated[float, typer.Option(help="Wall seconds per minute of arrivals "
                                                     "history (less replays traces "
                                                     "faster).")] = 60.0,
    log_limit: Annotated[int, typer.Option(help="MiB a job's log may grow to; then it says it "
                                                "was cut (0: no limit).")] = 256,
) -> None:
    """Start the control plane: store, local runtime, scheduler and REST API (foreground)."""
    from plinth.client import plinth_home
    from plinth.control.server import ServerConfig, serve

    cfg = ServerConfig(home=(home or plinth_home()).expanduser(), host=host, port=port, db=db,
                       fake_gpus=fake_gpus, runtime=runtime, ray_address=ray_address,
                       fence_after_s=fence_after, policy=policy, grace_s=grace,
                       min_runtime_s=min_runtime, round_s=round_s, max_body_bytes=max_body,
                       tls_cert=tls_cert, tls_key=tls_key, jobs_dir=jobs_dir,
                       serve_policy=serve_policy,
                       serve_tick_s=serve_tick, serve_minute_s=serve_minute,
                       log_limit_mib=log_limit)
    serve(cfg, announce=lambda s: console.print(s, highlight=False, soft_wrap=True))


def submit(specs: Annotated[list[Path], typer.Argument(help="Job spec YAML files.")],
           wait: Annotated[bool, typer.Option(
               "--wait", "-W", help="Return when the jobs have finished, with the exit code "
                                    "of the first that did not succeed (as sbatch --wait).")]
           = False,
           dependency: Annotated[str | None, typer.Option(
               "--dependency", "-d", help="As sbatch: afterok:12:13,after:9 (kinds after, "
                                          "afterany, afterok, afternotok).")] = None,
           server: Server = None, token: Token = None) -> None:
    """Submit workloads of any kind: jobs, services, FL tasks, tuning; prints each one's id."""
    from plinth.control.kinds import check_kind
    from plinth.core.jobspec import JobSpec
    from plinth.core.spec import load_spec

    loaded = [load_spec(path) for path in specs]  # all checked, then sent
    for spec, path in zip(loaded, specs):
        try:
            check_kind(spec)
        except PlinthError as e:
            raise PlinthError(f"{path}: {e}") from None
    if dependency:
        deps = parse_dependency(dependency)
        loaded = [j.model_copy(update={k: [*getattr(j, k), *v] for k, v in deps.items()})
                  if isinstance(j, JobSpec) else j for j in loaded]
    with connect(server, token) as c:
        ids = []
        for path, spec in zip(specs, loaded):
            w = c.submit_workload(spec, base=path.parent)
            if w["kind"] != "Job":
                where = f" at {w['status']['url']}" if w["status"].get("url") else ""
                console.print(f"Submitted {w['kind']} {w['name']} (workload {w['id']}, "
                              f"{path}){where}", highlight=False)
                continue
            ids.append(w["id"])
            what = f"array job {w['id']} ({w['tasks']} tasks)" if w.get("tasks") else \
                f"job {w['id']}"
            console.print(f"Submitted {what} ({path})", highlight=False)
        if wait:
            codes = [exit_code(c, job_id) for job_id in ids]
            raise typer.Exit(next((code for code in codes if code), 0))


def parse_dependency(text: str) -> dict[str, list[int]]:
    """sbatch's --dependency: "afterok:12:13,after:9" -> {"afterok": [12, 13], "after": [9]}."""
    from plinth.core.jobspec import DEPENDENCY_KINDS

    out: dict[str, list[int]] = {}
    for part in text.split(","):
        kind, *ids = part.strip().split(":")
        if kind not in DEPENDENCY_KINDS or not ids or not all(i.isdigit() for i in ids):
            raise PlinthError(f"--dependency: expected KIND:ID[:ID...] with KIND one of "
                              f"{', '.join(DEPENDENCY_KINDS)}; got {part.strip()!r}")
        out.setdefault(kind, []).extend(int(i) for i in ids)
    return out


def exit_code(c: Client, job_id: int) -> int:
    """Wait for a job (or every task of an array) to finish and say how it ended; its exit
    code (an array's highest), or 1 if it ended without one (cancelled before it ran, failed to
    launch)."""
    state = c.wait_all(job_id, timeout=float("inf"))
    j = c.job(job_id)
    tasks = c.jobs(array=job_id, all=True, limit=10000) if j.get("array_id") == job_id else [j]
    console.print(f"job {job_id}: {state}" + (f" ({j['reason']})" if state != "succeeded" and
                                               j["reason"] and len(tasks) == 1 else ""),
                  highlight=False)
    return max((0 if t["state"] == "succeeded" else t["exit_code"] or 1) for t in tasks)


def group_arrays(jobs: list[dict]) -> list[dict]:
    """One row per job array, as squeue shows one: `12_[0-99]`, its most active state, the
    tasks' counts by state as the reason."""
    out, arrays = [], {}
    for j in jobs:
        if j.get("array_id") is None:
            out.append(j)
        else:
            arrays.setdefault(j["array_id"], []).append(j)
    for aid, tasks in arrays.items():
        counts = {s: sum(t["state"] == s for t in tasks) for s in STATE_STYLE}
        state = next(s for s in ("running", "stopping", "pending", "failed", "timeout",
                                 "cancelled", "succeeded") if counts.get(s))
        idx = sorted(t["array_index"] for t in tasks)
        starts = [t["start_time"] for t in tasks if t["start_time"]]
        ends = [t["end_time"] for t in tasks if t["end_time"]]
        out.append({**tasks[0], "id": aid, "array_index": None, "label": f"{aid}_[{idx[0]}-"
                    f"{idx[-1]}]", "state": state, "start_time": min(starts, default=None),
                    "end_time": max(ends) if len(ends) == len(tasks) else None,
                    "reason": ", ".join(f"{n} {s}" for s, n in counts.items() if n)})
    return out


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def jobs_table(jobs: list[dict], now: float | None = None, *, wide: bool = False) -> Table:
    """squeue's view. It fits 80 columns: the reason is cut to what is left of one line (the
    full text is in `plinth show`); `wide` adds columns and cuts none (see print_jobs)."""
    now = now or time.time()
    cols = ["JOBID", "NAME", "TENANT", "STATE", "TIME", "GPUS"]
    cols += ["WORKERS", "PRI", "ATTEMPT", "SUBMITTED", "REASON"] if wide else ["REASON"]
    rows = []
    for j in sorted(jobs, key=lambda j: (j.get("array_id") or j["id"], j.get("array_index") or 0)):
        running = j["start_time"] if j["state"] in ("running", "stopping") else None
        elapsed = (now - running) if running else (
            (j["end_time"] - j["start_time"]) if j["end_time"] and j["start_time"] else None)
        reason = j["reason"] if j["state"] in ("pending", "stopping", "failed", "timeout") \
            or "label" in j else ""
        label = j.get("label") or (f"{j['array_id']}_{j['array_index']}"
                                   if j.get("array_id") is not None else str(j["id"]))
        row = [label, j["name"], j["tenant"], j["state"], _age(elapsed), f"{j['gpus']:g}"]
        if wide:
            row += [str(j["workers"]), str(j["priority"]), str(j["attempt"]),
                    time.strftime("%m-%d %H:%M:%S", time.localtime(j["submit_time"]))]
        rows.append([*row, reason if wide else (reason.splitlines() or [""])[0]])
    caps = {} if wide else {"NAME": 16, "TENANT": 10}
    widths = [min(max([len(col), *(len(r[i]) for r in rows)]), caps.get(col, 10**6))
              for i, col in enumerate(cols[:-1])]
    # Every column keeps its width but the reason, which gets what the line has left.
    room = max(len("REASON"), console.width - sum(widths) - 2 * len(widths))
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, width in zip(cols, [*widths, None]):
        right = col in ("JOBID", "TIME", "GPUS", "WORKERS", "PRI", "ATTEMPT")
        t.add_column(col, justify="right" if right else "left", no_wrap=col != "REASON" or not wide,
                     overflow="fold" if col == "REASON" and wide else "ellipsis",
                     width=width, max_width=None if wide or width else room)
    for r in rows:
        r[3] = f"[{STATE_STYLE.get(r[3], '')}]{r[3]}[/]"
        if not wide and len(r[-1]) > room:
            r[-1] = r[-1][:room - 1] + "…"
        t.add_row(*r)
    return t


OUTPUTS = ("table", "wide", "json", "yaml")
Output = Annotated[str, typer.Option("--output", "-o", help="table, wide, json or yaml.")]


def print_jobs(jobs: list[dict], output: str) -> None:
    if output not in OUTPUTS:
        raise PlinthError(f"--output: {output!r} is not one of {', '.join(OUTPUTS)}")
    if output in ("json", "yaml"):
        import json

        import yaml

        typer.echo(json.dumps(jobs, indent=2) if output == "json" else
                   yaml.safe_dump(jobs, sort_keys=False), nl=output == "json")
    elif output == "wide":  # as kubectl's: every column whole, wider than the terminal if need be
        t = jobs_table(jobs, wide=True)
        need = console.measure(t, options=console.options.update_width(10**4)).maximum
        Console(width=max(console.width, need)).print(t)
    else:
        console.print(jobs_table(jobs))


def ls(all: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
       tenant: Annotated[str | None, typer.Option("--tenant", "-t")] = None,
       state: Annotated[list[str] | None, typer.Option(
           "--state", "-s", help="Only jobs in these states (comma-separated or repeated); "
                                 "implies --all.")] = None,
       name: Annotated[str | None, typer.Option("--name", "-n", help="Only jobs of this "
                                                                     "name.")] = None,
       limit: Annotated[int, typer.Option(help="Jobs per page.", min=1, max=10000)] = 1000,
       page: Annotated[int, typer.Option(help="Which page, newest jobs first.", min=1)] = 1,
       expand: Annotated[bool, typer.Option("--expand", "-r", help="One line per task of a "
                                                                  "job array.")] = False,
       output: Output = "table", server: Server = None, token: Token = None) -> None:
    """The queue, as squeue shows it: pending, running and stopping jobs (all with --all)."""
    from plinth.control.kinds import CONTROLLERS

    table = output in ("table", "wide")
    with connect(server, token) as c:
        jobs, total = c.jobs_page(all=all, tenant=tenant, states=state, name=name, limit=limit,
                                  offset=(page - 1) * limit)
        # the other kinds' tables: every one of them, on each page
        ws = c.workloads(all=all, tenant=tenant, kinds=list(CONTROLLERS.names())) \
            if table and not name and not state else []
    print_jobs(group_arrays(jobs) if table and not expand else jobs, output)
    if ws:
        from plinth.cli.tune import tune_table

        for kind in (services_table([w for w in ws if w["kind"] == "Service"],
                                    wide=output == "wide"),
                     fl_table([w for w in ws if w["kind"] == "FLTask"]),
                     tune_table([w for w in ws if w["kind"] == "Tune"])):
            if kind.row_count:
                console.print()
                console.print(kind)
    first = (page - 1) * limit + 1
    if table and not jobs and page > 1:
        console.print(f"page {page} is past the last: {total} jobs, {limit} a page",
                      highlight=False)
    elif table and (total > len(jobs) or page > 1):
        more = f"; more with --page {page + 1}" if first - 1 + len(jobs) < total else ""
        console.print(f"showing {first}-{first - 1 + len(jobs)} of {total} jobs{more}",
                      highlight=False)


JobRef = Annotated[str, typer.Argument(metavar="JOB", help="A job id, or ARRAY_INDEX "
                                                            "for a task of an array; or a "
                                                            "service's name.")]


def show_workload(w: dict) -> None:
    """A service's status (desired replicas and why, load, latency), its units and spec."""
    import yaml

    st = dict(w["status"])
    console.print(f"[bold]{w['kind']} {w['name']}[/] (workload {w['id']})  tenant "
                  f"{w['tenant']}  state {w['state']}", highlight=False)
    if st.get("url"):
        console.print(f"address: {st.pop('url')}", highlight=False)
    if "desired" in st:
        console.print(f"replicas: {st.pop('desired')} desired, {st.pop('ready', 0)} ready; "
                      f"load {st.pop('rate_rps', 0):g}/s now, {st.pop('predicted_rps', 0):g}/s "
                      f"predicted; p99 {_ms(st.pop('p99_ms', None))}", highlight=False)
    if st.get("reason"):
        console.print(f"why: {st.pop('reason')}", highlight=False)
    if st.get("tuned"):  # a tuned service: which share's records its replicas run
        console.print(f"tuned: {st.pop('tuned')}", highlight=False)
    if w["kind"] == "FLTask":
        where = st.pop("address", None) or "- (the server has not reported its address)"
        console.print(f"clients connect to {where}; round "
                      f"{st.pop('round', 0)} of {st.pop('rounds', '?')}; last round: "
                      f"{st.pop('participants', 0)} participants, {st.pop('updates', 0)} "
                      f"updates, {st.pop('failures', 0)} failures", highlight=False)
        for m in st.pop("middles", []):  # LIFL's per-node aggregators
            console.print(f"  {m['name']}: clients with cid mod {len(w['status']['middles'])} "
                          f"= {m['name'].rsplit('-', 1)[1]} ({m['clients']}) connect to "
                          f"{m.get('address') or '- (not reported yet)'}", highlight=False)
        if st.get("epsilon") is not None:
            console.print(f"privacy: ε {st.pop('epsilon'):.3g} spent of "
                          f"{st.pop('epsilon_budget', None) or '?'}", highlight=False)
        per_round = st.pop("per_round", [])
        if per_round:
            console.print("accuracy per round: " + ", ".join(
                f"{r['round']}: -" if r["accuracy"] is None else f"{r['round']}: {r['accuracy']:.4f}"
                for r in per_round), highlight=False)
        for key in ("failed_server_job", "upstream"):
            st.pop(key, None)
    for key in ("router", "decided_at", "decisions", "units_told"):
        st.pop(key, None)
    if st:
        console.print("status: " + ", ".join(f"{k} {v}" for k, v in st.items()),
                      highlight=False)
    console.print("[bold]units[/]")
    for u in w["units"]:
        console.print(f"  {u['unit']:<12} job {u['job_id']:<6} "
                      f"[{STATE_STYLE.get(u['state'], '')}]{u['state']}[/]  {u['reason']}",
                      highlight=False)
    console.print("[bold]spec[/]")
    console.print(yaml.safe_dump(w["spec"], sort_keys=False).rstrip(), highlight=False)


def show(job: JobRef, server: Server = None, token: Token = None) -> None:
    """A job's spec, allocation, events, and why it is pending; or a service's status."""
    import yaml

    with connect(server, token) as c:
        j = c.workload(job)
    if j["kind"] != "Job":
        show_workload(j)
        return
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


def logs(job: JobRef, follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
         server: Server = None, token: Token = None) -> None:
    """Print a job's log (all attempts); -f follows it until the job finishes."""
    with connect(server, token) as c:
        if follow:
            for chunk in c.follow(job):
                typer.echo(chunk, nl=False)
        else:
            typer.echo(c.logs(job), nl=False)


def cancel(jobs: Annotated[list[str], typer.Argument(
               metavar="JOB...", help="Job ids; an array's id cancels all its tasks, "
                                      "ARRAY_INDEX one of them.")],
           server: Server = None, token: Token = None) -> None:
    """Cancel jobs: a pending job at once, a running one with SIGTERM, then SIGKILL."""
    failed = False
    with connect(server, token) as c:
        for job in jobs:
            try:
                # As scancel: ARRAY is every task of it, ARRAY_INDEX one
                w = c.cancel_workload(job, array="_" not in job)
                said = f"job {job}: {w['state']}" if w["kind"] == "Job" else \
                    f"{job}: {w['state']}"
                if "_" not in job and w["kind"] == "Job" and \
                        c.job(w["id"]).get("array_id") == w["id"]:  # every task's state
                    [row] = group_arrays(c.jobs(array=w["id"], all=True, limit=10000))
                    said = f"array {job}: {row['reason']}"
                console.print(said, highlight=False)
            except PlinthError as e:
                console.print(f"[red]job {job}:[/] {e}", highlight=False)
                failed = True
    if failed:  # as `show` and `logs` do for a job that is not there
        raise typer.Exit(2)


def nodes(server: Server = None, token: Token = None) -> None:
    """Nodes, their GPUs and what is allocated on them."""
    with connect(server, token) as c:
        console.print(nodes_table(c.nodes()))


def top(interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
        iterations: Annotated[int, typer.Option(help="Stop after this many frames "
                                                     "(0: until Ctrl-C).")] = 0,
        server: Server = None, token: Token = None) -> None:
    """A live view of nodes and jobs."""
    with connect(server, token) as c:
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
               user: Annotated[str | None, typer.Option(
                   help="An existing Unix user its jobs run as (root control plane) "
                        "[default: plinth-NAME, made for it].")] = None,
               server: Server = None, token: Token = None) -> None:
    """Create a tenant or change its quota."""
    with connect(server, token) as c:
        t = c.set_tenant(name, gpus, borrowing_limit, user)
        runs_as = f", jobs run as Unix user {t['user']}" if t.get("user") else ""
        console.print(f"tenant {name}: quota {gpus if gpus is not None else 'equal share'} GPUs"
                      f"{runs_as}", highlight=False)


@tenant_app.command("token")
def tenant_token(name: str,
                 expires: Annotated[str | None, typer.Option(
                     help="Stop working after this long: seconds or 90s, 30m, 12h, 30d "
                          "[default: until revoked].")] = None,
                 server: Server = None, token: Token = None) -> None:
    """Create an API token for a tenant and print it (it is not shown again); its id, for
    `plinth tenant revoke`, goes to stderr."""
    from plinth.core.jobspec import parse_duration

    try:
        expires_in = None if expires is None else parse_duration(expires)
    except ValueError as e:
        raise PlinthError(f"--expires: {e}") from None
    with connect(server, token) as c:
        t = c.new_token(name, expires_in)
    typer.echo(t["token"])
    until = "until revoked" if t["expires"] is None else f"until {_when(t['expires'])}"
    typer.echo(f"token id {t['id']} for tenant {name}, valid {until}", err=True)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@tenant_app.command("tokens")
def tenant_tokens(name: Annotated[str | None, typer.Argument(help="Only this tenant's.")] = None,
                  server: Server = None, token: Token = None) -> None:
    """List API tokens by id (never by secret)."""
    with connect(server, token) as c:
        rows = c.tokens(name)
    t = Table("ID", "TENANT", "ADMIN", "CREATED", "EXPIRES", box=None, header_style="bold")
    for r in rows:
        t.add_row(r["id"], r["tenant"], "yes" if r["admin"] else "", _when(r["created"]),
                  "never" if r["expires"] is None else _when(r["expires"]))
    console.print(t)


@tenant_app.command("revoke")
def tenant_revoke(token_id: Annotated[str, typer.Argument(metavar="TOKEN-ID")],
                  server: Server = None, token: Token = None) -> None:
    """Revoke an API token by its id; it stops working at once."""
    with connect(server, token) as c:
        c.revoke_token(token_id)
    console.print(f"token {token_id} revoked", highlight=False)


@tenant_app.command("ls")
def tenant_ls(server: Server = None, token: Token = None) -> None:
    """List tenants and their quotas."""
    with connect(server, token) as c:
        t = Table("TENANT", "GPUS", "BORROWING LIMIT", "UNIX USER", box=None,
                  header_style="bold")
        for row in c.tenants():
            t.add_row(row["name"], "equal share" if row["gpus"] is None else f"{row['gpus']:g}",
                      "-" if row["borrowing_limit"] is None else f"{row['borrowing_limit']:g}",
                      row.get("user") or "(the server's)")
        console.print(t)


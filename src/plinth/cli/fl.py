"""`plinth fl server|client|sim`: federated learning from one app YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plinth.core.errors import PlinthError

app = typer.Typer(help="Federated learning: a server, its clients, or a simulated federation.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()


@app.callback()
def _group() -> None:
    """Federated learning: a server, its clients, or a whole simulated federation."""


def _fmt(v: float | None, pattern: str = "{:.4f}") -> str:
    return "-" if v is None else pattern.format(v)


def _round_table(result: dict) -> Table:
    t = Table(title=f"{result['app']} · {result['strategy']} · {result['clients']} clients")
    for col in ("round", "accuracy", "loss", "seconds", "MB up", "MB down", "updates", "failures"):
        t.add_column(col, justify="right")
    for r in result["rounds"]:
        t.add_row(str(r["round"]), _fmt(r["accuracy"]), _fmt(r["loss"]), f"{r['seconds']:.2f}",
                  f"{r['bytes_up'] / 1e6:.2f}", f"{r['bytes_down'] / 1e6:.2f}", str(r["updates"]),
                  str(r["failures"]))
    return t


@app.command()
def sim(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    clients: Annotated[int, typer.Option(min=1, help="Number of virtual clients.")] = 10,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds (default: the app's).")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Processes for clients.")] = None,
    strategy: Annotated[str | None, typer.Option(help="Override strategy.name.")] = None,
    compression: Annotated[str | None, typer.Option(help="none | q8 | q16 | topk.")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint folder.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from the checkpoint folder.")] = False,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
    out: Annotated[str | None, typer.Option(help="Folder for PNG plots.")] = None,
) -> None:
    """Simulate a federation: virtual clients in a process pool, the real server."""
    from plinth.fl.sim import run_sim

    if resume and not checkpoint:
        raise PlinthError("--resume needs --checkpoint FOLDER")
    overrides = {"strategy.name": strategy, "compression.kind": compression,
                 "checkpoint_dir": str(Path(checkpoint).resolve()) if checkpoint else None}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("rounds", total=None, status="starting clients…")

        def started(spec, first: int) -> None:
            bar.update(task, total=spec.server.rounds, completed=first - 1, status="")

        def tick(rec) -> None:
            bar.update(task, completed=rec.round,
                       status=f"acc {_fmt(rec.accuracy)}  loss {_fmt(rec.loss)}")
            _print_round(rec)

        result = run_sim(app_yaml, clients=clients, rounds=rounds, workers=workers,
                         resume=resume, overrides=overrides, on_round=tick, on_start=started)
    _report(result, json_path, out)


def _report(result: dict, json_path: str | None, out: str | None) -> None:
    from plinth.fl.sim import plot, write_json

    console.print(_round_table(result))
    console.print(f"final accuracy {_fmt(result['final_accuracy'])}, "
                  f"{result['total_bytes_up'] / 1e6:.1f} MB up, "
                  f"{result['total_bytes_down'] / 1e6:.1f} MB down, "
                  f"{result['total_seconds']:.1f} s")
    if result.get("epsilon") is not None:
        console.print(f"privacy: epsilon {result['epsilon']:.4f} at delta {result['delta']:g}",
                      highlight=False)
    if result.get("stopped"):
        console.print(f"[bold yellow]stopped early:[/] {result['stopped']}", highlight=False)
    if json_path:
        write_json(result, json_path)
        console.print(f"results: {json_path}")
    if out or json_path:
        for p in plot(result, out or Path(json_path).with_suffix("")):  # type: ignore[arg-type]
            console.print(f"plot: {p}")


def _print_round(rec) -> None:
    console.print(f"round {rec.round:3d}  accuracy {_fmt(rec.accuracy)}  loss {_fmt(rec.loss)}  "
                  f"{rec.seconds:6.2f}s  up {rec.bytes_up / 1e6:.2f} MB  "
                  f"failures {len(rec.failures)}", highlight=False)
    if rec.metrics.get("secagg_aborted"):  # the model stayed: say why
        console.print(f"  {rec.reason}", highlight=False)


@app.command()
def server(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    address: Annotated[str, typer.Option(help="Listen on HOST:PORT.")] = "0.0.0.0:8080",
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds (default: the app's).")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint folder.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from the checkpoint folder.")] = False,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
    out: Annotated[str | None, typer.Option(help="Folder for PNG plots.")] = None,
) -> None:
    """Serve a federation over gRPC; clients join with `plinth fl client`."""
    from plinth.fl.deploy import run_server

    overrides = {"checkpoint_dir": str(Path(checkpoint).resolve()) if checkpoint else None}

    def listening(spec, port: int) -> None:
        tls = "TLS" if spec.transport.tls else "plaintext"
        console.print(f"listening on port {port} ({tls}); waiting for "
                      f"{max(spec.server.min_available, spec.server.min_clients)} clients",
                      highlight=False)

    result = run_server(app_yaml, address=address, rounds=rounds, resume=resume,
                        overrides=overrides, on_round=_print_round, on_listen=listening)
    _report(result, json_path, out)


@app.command()
def client(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    server: Annotated[str, typer.Option("--server", help="The server's HOST:PORT.")],
    cid: Annotated[int, typer.Option(min=0, help="This client's data partition.")] = 0,
    clients: Annotated[int | None, typer.Option(min=1, help="Partitions (data.clients).")] = None,
    token: Annotated[str | None, typer.Option(help="Token (or $PLINTH_FL_TOKEN).")] = None,
) -> None:
    """Join a federation and train on local data until the server finishes."""
    from plinth.fl.deploy import run_client

    ran = run_client(app_yaml, server=server, cid=cid, clients=clients, token=token)
    console.print(f"client {cid}: {ran} tasks done; the server has finished")


@app.command()
def aggregator(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    server: Annotated[str, typer.Option("--server", help="The upstream server's HOST:PORT.")],
    clients: Annotated[int, typer.Option(min=1, help="Clients to wait for before joining.")],
    address: Annotated[str, typer.Option(help="Listen for this machine's clients on "
                                                "HOST:PORT.")] = "0.0.0.0:8081",
    name: Annotated[str, typer.Option(help="This aggregator's client id upstream.")] =
        "aggregator",
    token: Annotated[str | None, typer.Option(help="Upstream token (or $PLINTH_FL_TOKEN).")]
        = None,
) -> None:
    """A machine's middle aggregator: this machine's clients join it (`plinth fl client
    --server` its address); it joins the server as one client and sends one update per round."""
    from plinth.fl.deploy import run_aggregator

    def listening(port: int) -> None:
        console.print(f"aggregator {name}: listening on port {port}; waiting for {clients} "
                      f"clients", highlight=False)

    ran = run_aggregator(app_yaml, server=server, address=address, clients=clients, name=name,
                         token=token, on_listen=listening)
    console.print(f"aggregator {name}: {ran} tasks done; the server has finished")


def _admm_round(rec: dict) -> None:
    err = f"  ADMM error {rec['admm_error']:.1e}" if "admm_error" in rec else ""
    console.print(f"round {rec['round']:3d}  accuracy {_fmt(rec['accuracy'])}  "
                  f"loss {_fmt(rec['loss'])}  {rec['seconds']:6.2f}s{err}", highlight=False)


@app.command()
def admm(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    sites: Annotated[int | None, typer.Option(help="Sites, 3 mod 6 (default: admm.sites).")
                     ] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds (default: admm.rounds).")
                      ] = None,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
) -> None:
    """Decentralised training: sites on loopback average their models by ADMM (no server)."""
    from plinth.fl.admm.task import run_admm_app
    from plinth.fl.sim import write_json

    result = run_admm_app(app_yaml, sites=sites, rounds=rounds, on_round=_admm_round)
    console.print(f"final accuracy {_fmt(result['final_accuracy'])}, {result['sites']} sites, "
                  f"{result['total_seconds']:.1f} s", highlight=False)
    console.print(f"ADMM: {result['admm']['iterations']} iterations a round, largest error vs "
                  f"the exact weighted average {result['max_admm_error']:.1e}", highlight=False)
    if json_path:
        write_json(result, json_path)
        console.print(f"results: {json_path}")


@app.command("admm-site")
def admm_site(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    site: Annotated[int, typer.Option(min=0, help="This site's number (its data partition).")],
    peers: Annotated[str | None, typer.Option(help="Every site's HOST:PORT, in site order, "
                                                   "comma-separated (this site listens on its own).")
                     ] = None,
    peers_file: Annotated[str | None, typer.Option(help="Or a file of one HOST:PORT a line.")
                          ] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds (default: admm.rounds).")
                      ] = None,
    token: Annotated[str | None, typer.Option(help="Token (or $PLINTH_FL_TOKEN).")] = None,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
) -> None:
    """One ADMM site as its own process; start one per entry of --peers."""
    from plinth.fl.admm.task import read_peers, run_site
    from plinth.fl.sim import write_json

    result = run_site(app_yaml, site=site, addresses=read_peers(peers, peers_file),
                      rounds=rounds, token=token, on_round=_admm_round)
    console.print(f"site {site}: final accuracy {_fmt(result['final_accuracy'])}")
    if json_path:
        write_json(result, json_path)
        console.print(f"results: {json_path}")

"""`plinth fl server|client|sim|certs|tokens|consent`: federated learning from one app YAML.

A command imports what it runs when it runs, so that `--help` stays quick. Each one that reads
an APP.yaml imports `plinth.control.kinds` first: it registers every kind, so that a spec of
another kind is named as such ("this command reads a FLTask spec, not a Service spec").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plinth.core.errors import PlinthError, SpecError

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
    workers: Annotated[int | None, typer.Option(
        min=1, help="Processes (pool) or actors (ray) for clients.")] = None,
    backend: Annotated[str, typer.Option(help="pool (a process pool) | ray (Ray actors).")
                       ] = "pool",
    ray_address: Annotated[str | None, typer.Option(
        metavar="HOST:PORT|auto",
        help="Ray cluster for --backend ray (default: a private local Ray).")] = None,
    client_cpus: Annotated[float, typer.Option(help="CPUs per client actor (ray).")] = 1.0,
    client_gpus: Annotated[float, typer.Option(
        help="GPUs per client actor, a share such as 0.25 (ray).")] = 0.0,
    strategy: Annotated[str | None, typer.Option(help="Override strategy.name.")] = None,
    compression: Annotated[str | None, typer.Option(help="none | q8 | q16 | topk.")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint folder.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from the checkpoint folder.")] = False,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
    out: Annotated[str | None, typer.Option(help="Folder for PNG plots.")] = None,
) -> None:
    """Simulate a federation: virtual clients in a process pool or on Ray, the real server."""
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
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
                         resume=resume, overrides=overrides, on_round=tick, on_start=started,
                         backend=backend, ray_address=ray_address, client_cpus=client_cpus,
                         client_gpus=client_gpus)
    _report(result, json_path, out)


def _report(result: dict, json_path: str | None, out: str | None) -> None:
    from plinth.fl.results import plot, write_json

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


TokensOpt = Annotated[str | None, typer.Option(
    "--tokens", help="File of 'client_id token' lines (plinth fl tokens); overrides "
                     "transport.tokens.")]
NoTokensOpt = Annotated[bool, typer.Option(
    "--no-tokens", help="Accept clients without tokens (trusted networks and tests only).")]
TlsOpt = Annotated[str | None, typer.Option(
    "--tls", metavar="DIR", help="TLS with the pair in DIR (plinth fl certs DIR); overrides "
                                 "transport.tls.")]


def _transport_overrides(tokens: str | None, tls: str | None) -> dict:
    from plinth.fl.transport.certs import tls_files

    out: dict = {}
    if tokens is not None:
        out["transport.tokens"] = str(Path(tokens).resolve())
    if tls is not None:
        out["transport.tls"] = tls_files(str(Path(tls).resolve()))
    return out


@app.command()
def server(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    address: Annotated[str | None, typer.Option(
        help="Listen on HOST:PORT (0.0.0.0:PORT for every interface). Default: 127.0.0.1:8080; "
             "as a unit of the platform, its node's address on a free port.")] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds (default: the app's).")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint folder.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from the checkpoint folder.")] = False,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
    out: Annotated[str | None, typer.Option(help="Folder for PNG plots.")] = None,
    tokens: TokensOpt = None,
    no_tokens: NoTokensOpt = False,
    tls: TlsOpt = None,
) -> None:
    """Serve a federation over gRPC; clients join with `plinth fl client`."""
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.deploy import run_server

    overrides = {"checkpoint_dir": str(Path(checkpoint).resolve()) if checkpoint else None,
                 **_transport_overrides(tokens, tls)}

    def listening(spec, port: int) -> None:
        tls = "TLS" if spec.transport.tls else "plaintext"
        console.print(f"listening on port {port} ({tls}); waiting for "
                      f"{max(spec.server.min_available, spec.server.min_clients)} clients",
                      highlight=False)

    result = run_server(app_yaml, address=address, rounds=rounds, resume=resume,
                        overrides=overrides, on_round=_print_round, on_listen=listening,
                        require_tokens=not no_tokens)
    _report(result, json_path, out)


@app.command()
def client(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    server: Annotated[str | None, typer.Option("--server", help="The server's HOST:PORT.")]
        = None,
    task: Annotated[str | None, typer.Option(
        "--task", help="Or join the FL task of this name on the platform: its server's "
                       "address (or the middle aggregator's of this client) comes from the "
                       "control plane ($PLINTH_SERVER, $PLINTH_TOKEN), and again if the "
                       "server moves.")] = None,
    cid: Annotated[int, typer.Option(min=0, help="This client's data partition.")] = 0,
    clients: Annotated[int | None, typer.Option(min=1, help="Partitions (data.clients).")] = None,
    token: Annotated[str | None, typer.Option(help="Token (or $PLINTH_FL_TOKEN).")] = None,
    tls: Annotated[str | None, typer.Option("--tls", metavar="DIR", help="Pin the CA "
                                            "DIR/server.pem (plinth fl certs DIR).")] = None,
    cids: Annotated[str | None, typer.Option(help="Several clients in this process, e.g. 0-9 "
                                                  "or 0,4,7, each with its token from --tokens "
                                                  "(instead of --cid and --token).")] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", metavar="FILE", help="Tokens file "
                                               "(plinth fl tokens) for --cids.")] = None,
) -> None:
    """Join a federation and train on local data until the server finishes."""
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.deploy import parse_cids, run_clients

    if (server is None) == (task is None):
        raise SpecError("--server or --task: give one, the server's HOST:PORT or the name of "
                        "an FL task on the platform")
    if cids is None:
        ids, by_id, what = [cid], {cid: token}, "--cid"
    else:
        if token is not None or cid != 0:
            raise SpecError("--cids: give --cids with --tokens, or --cid with --token, not both")
        (ids, by_id), what = parse_cids(cids, tokens), "--cids"
    ran = run_clients(app_yaml, server=server, locate=_task_locator(task) if task else None,
                      cids=ids, clients=clients, tokens=by_id,
                      overrides=_transport_overrides(None, tls), what=what)
    who = f"client {ids[0]}" if len(ids) == 1 else f"clients {cids}"
    console.print(f"{who}: {ran} tasks done; the server has finished")


def _task_locator(task: str):
    """Where client `cid` of the FL task `task` connects, as the control plane says (None
    while it does not know). The task must exist; later failures to ask (the control plane
    restarting) read as not known yet."""
    import logging

    from plinth.client import ApiError, Client
    from plinth.fl.workload import client_address

    api = Client()
    try:
        kind = api.workload(task)["kind"]
    except ApiError as e:
        raise SpecError(f"--task: {e}") from None
    if kind != "FLTask":
        raise SpecError(f"--task: {task!r} is a {kind}, not an FLTask")

    def locate(cid: int) -> str | None:
        try:
            return client_address(api.workload(task)["status"], cid)
        except PlinthError as e:
            logging.getLogger("plinth.fl").warning("--task %s: %s", task, e)
            return None

    return locate


@app.command()
def leaf(
    connect: Annotated[str, typer.Option(help="The server's aggregator address "
                                              "(server.aggregation.leaf_listen).")],
    token_file: Annotated[str, typer.Option(help="File holding the task's leaf token "
                                                 "(server.aggregation.leaf_token_file).")],
    threads: Annotated[int, typer.Option(min=1, help="BLAS threads for folding.")] = 1,
) -> None:
    """A leaf aggregator of a tree-mode server, started by the runtime on the server's node:
    it joins with the task's token and folds the updates the server assigns it each round."""
    from plinth.fl.aggregate.leaf import main

    raise typer.Exit(main(["--connect", connect, "--token-file", token_file,
                           "--threads", str(threads)]))


@app.command()
def aggregator(
    app_yaml: Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec.")],
    server: Annotated[str, typer.Option("--server", help="The upstream server's HOST:PORT.")],
    clients: Annotated[int, typer.Option(min=1, help="Clients to wait for before joining.")],
    address: Annotated[str | None, typer.Option(
        help="Listen for this machine's clients on HOST:PORT. Default: 127.0.0.1:8081; as a "
             "unit of the platform, its node's address on a free port.")] = None,
    name: Annotated[str, typer.Option(help="This aggregator's client id upstream.")] =
        "aggregator",
    token: Annotated[str | None, typer.Option(help="Upstream token (or $PLINTH_FL_TOKEN).")]
        = None,
    token_file: Annotated[str | None, typer.Option(help="Or read the upstream token from "
                                                        "this file.")] = None,
    fraction: Annotated[float, typer.Option(help="The share of this machine's clients that "
                                                 "take part in each round (at least one).")]
        = 1.0,
    status_dir: Annotated[str | None, typer.Option(help="With server.aggregation.mode: tree, "
                                                        "keep its state (tree.json) here.")]
        = None,
    tokens: TokensOpt = None,
    no_tokens: NoTokensOpt = False,
    tls: TlsOpt = None,
) -> None:
    """A machine's middle aggregator: this machine's clients join it (`plinth fl client
    --server` its address); it joins the server as one client and sends one update per round."""
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.deploy import run_aggregator

    def listening(port: int) -> None:
        console.print(f"aggregator {name}: listening on port {port}; waiting for {clients} "
                      f"clients", highlight=False)

    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise SpecError(f"--token-file: cannot read {token_file} ({e.strerror})") from None
    ran = run_aggregator(app_yaml, server=server, address=address, clients=clients, name=name,
                         token=token, status_dir=status_dir, fraction=fraction,
                         on_listen=listening,
                         overrides=_transport_overrides(tokens, tls),
                         require_tokens=not no_tokens)
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
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.admm.task import run_admm_app
    from plinth.fl.results import write_json

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
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.admm.task import read_peers, run_site
    from plinth.fl.results import write_json

    result = run_site(app_yaml, site=site, addresses=read_peers(peers, peers_file),
                      rounds=rounds, token=token, on_round=_admm_round)
    console.print(f"site {site}: final accuracy {_fmt(result['final_accuracy'])}")
    if json_path:
        write_json(result, json_path)
        console.print(f"results: {json_path}")


@app.command()
def certs(
    folder: Annotated[str, typer.Argument(metavar="DIR", help="Folder for server.pem and "
                                                              "server.key.")],
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="A name or IP the server is reached at (repeat; default localhost "
                       "and 127.0.0.1).")] = None,
    days: Annotated[int, typer.Option(min=1, help="Days the certificate is valid.")] = 365,
) -> None:
    """Write a self-signed TLS pair: `plinth fl server --tls DIR`, clients `--tls DIR`."""
    from plinth.fl.transport.certs import write_pair

    cert, key = write_pair(folder, host or ["localhost", "127.0.0.1"], days=days)
    console.print(f"certificate {cert} (clients pin it as their CA), key {key}", highlight=False)


@app.command()
def tokens(
    path: Annotated[str, typer.Argument(metavar="FILE", help="Tokens file to write.")],
    clients: Annotated[int, typer.Option(min=1, help="Client ids 0..N-1.")],
) -> None:
    """Write one fresh secret token per client id (`plinth fl server --tokens FILE`)."""
    from plinth.fl.transport.certs import write_tokens

    p = write_tokens(path, [str(i) for i in range(clients)])
    console.print(f"{clients} tokens in {p}; give client i the token on line i+1", highlight=False)


consent_app = typer.Typer(help="A client's consent, granted and revoked through the server as "
                               "its token's identity; the operator's audit log.",
                          no_args_is_help=True)
app.add_typer(consent_app, name="consent")

AppArg = Annotated[str, typer.Argument(metavar="APP.yaml", help="FL app spec (its consent.purpose).")]
ServerOpt = Annotated[str, typer.Option("--server", help="The server's HOST:PORT.")]
TokenOpt = Annotated[str | None, typer.Option(help="This client's token (or $PLINTH_FL_TOKEN).")]


def _consent_call(app_yaml: str, server: str, token: str | None, tls: str | None,
                  request: dict) -> dict:
    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.deploy import consent_request

    return consent_request(app_yaml, server=server, token=token, request=request,
                           overrides=_transport_overrides(None, tls))


@consent_app.command("grant")
def consent_grant(app_yaml: AppArg, server: ServerOpt, token: TokenOpt = None,
                  version: Annotated[int, typer.Option(min=1, help="Consent text version.")] = 1,
                  tls: TlsOpt = None) -> None:
    """Grant consent for the app's purpose, as the client the token names."""
    r = _consent_call(app_yaml, server, token, tls, {"action": "grant", "version": version})
    console.print(f"client {r['client_id']}: consent granted for {r['granted']!r} "
                  f"(version {r['version']})", highlight=False)


@consent_app.command("revoke")
def consent_revoke(app_yaml: AppArg, server: ServerOpt, token: TokenOpt = None,
                   tls: TlsOpt = None) -> None:
    """Revoke it: from the next round the client is not selected and its updates are refused."""
    r = _consent_call(app_yaml, server, token, tls, {"action": "revoke"})
    what = "revoked" if r["had_consent"] else "had no live consent to revoke"
    console.print(f"client {r['client_id']}: {what} for {r['revoked']!r}", highlight=False)


@consent_app.command("list")
def consent_list(app_yaml: AppArg, server: ServerOpt, token: TokenOpt = None,
                 tls: TlsOpt = None) -> None:
    """This client's consent records and its audit log on the server."""
    r = _consent_call(app_yaml, server, token, tls, {"action": "list"})
    _audit_table(r["audit"], f"client {r['client_id']}")
    for c in r["consents"]:
        state = "live" if c["revoked_at"] is None else f"revoked at {c['revoked_at']:.0f}"
        console.print(f"{c['purpose']} version {c['version']}: {state}", highlight=False)


@consent_app.command("audit")
def consent_audit(
    app_yaml: AppArg,
    client: Annotated[str | None, typer.Option(help="Only this client id.")] = None,
    event: Annotated[str | None, typer.Option(help="granted | revoked | selected | excluded | "
                                                    "participated")] = None,
    export: Annotated[str | None, typer.Option(help="Write the entries to FILE (.csv, else "
                                                     "JSON lines).")] = None,
) -> None:
    """The operator's view: the audit log of the app's consent.registry."""
    from dataclasses import asdict

    import plinth.control.kinds  # noqa: F401  # registers the kinds: see the docstring
    from plinth.fl.app import load_app
    from plinth.fl.privacy.consent import ConsentRegistry, export_audit

    spec = load_app(app_yaml)
    if spec.consent is None:
        raise PlinthError(f"{app_yaml}: consent: the app asks no consent")
    path = spec.resolve(spec.consent.registry) or ""
    if not Path(path).is_file():
        raise PlinthError(f"consent.registry: {path} does not exist")
    reg = ConsentRegistry(path)
    try:
        entries = reg.audit_log(client_id=client, event=event)
    finally:
        reg.close()
    if export:
        n = export_audit(entries, export)
        console.print(f"{n} audit entries written to {export}", highlight=False)
        return
    _audit_table([asdict(e) for e in entries], path)


def _audit_table(entries: list[dict], title: str) -> None:
    t = Table(title=f"consent audit · {title}")
    for col in ("seq", "time", "client", "purpose", "event", "task", "round", "detail"):
        t.add_column(col)
    for e in entries:
        t.add_row(str(e["seq"]), f"{e['ts']:.0f}", e["client_id"], e["purpose"], e["event"],
                  e["task_id"] or "", "" if e["round"] is None else str(e["round"]),
                  e["detail"] or "")
    console.print(t)

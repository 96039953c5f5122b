"""Aggregation across machines: flat clients against one middle aggregator per machine, over gRPC.

Starts real processes on 127.0.0.1: one `plinth fl server`; then either `--clients` `plinth fl
client` processes joined to it directly (flat), or `--machines` `plinth fl aggregator` processes
with `--clients / --machines` clients each (the LIFL tree across machines: one update per machine
goes up). Reports, per layout, what the server received each round (updates, MB up), seconds per
round and test accuracy, from the server's JSON.

    .venv/bin/python bench/fl_middle.py [--app examples/fl/mnist/app.yaml] [--clients 8]
        [--machines 2] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

FL = [sys.executable, "-m", "plinth.cli.main", "fl"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _app(src: str, clients: int, rounds: int, joiners: int, folder: Path) -> Path:
    """The app for one layout: every round takes all `joiners` (the server's direct clients)."""
    doc = yaml.safe_load(Path(src).read_text())
    doc["code"] = str((Path(src).parent / doc["code"]).resolve())
    doc["data"]["clients"] = clients
    doc["server"].update(rounds=rounds, fraction=1.0, min_clients=joiners,
                         min_available=joiners, straggler_timeout=600, wait_timeout=600)
    p = folder / "app.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def run(app: Path, clients: int, machines: int, out: Path) -> dict:
    """One federation; machines == 0 means flat."""
    top = _port()
    server = subprocess.Popen([*FL, "server", str(app), "--address", f"127.0.0.1:{top}",
                               "--json", str(out), "--no-tokens"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    procs = [server]
    per = clients // max(1, machines)
    if machines == 0:
        targets = [f"127.0.0.1:{top}"] * clients
    else:
        targets = []
        for m in range(machines):
            port = _port()
            procs.append(subprocess.Popen(
                [*FL, "aggregator", str(app), "--server", f"127.0.0.1:{top}", "--clients",
                 str(per), "--address", f"127.0.0.1:{port}", "--name", f"machine{m}",
                 "--no-tokens"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            targets += [f"127.0.0.1:{port}"] * per
    procs += [subprocess.Popen([*FL, "client", str(app), "--server", t, "--cid", str(i),
                                "--clients", str(clients)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
              for i, t in enumerate(targets)]
    try:
        errs = [p.communicate(timeout=1800)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise SystemExit("a process failed:\n" + "\n".join(e for e in errs if e))
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--app", default="examples/fl/mnist/app.yaml")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.machines < 1 or args.clients % args.machines:
        raise SystemExit("--clients must be a multiple of --machines (>= 1)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for machines in (0, args.machines):
            folder = Path(tmp) / str(machines)
            folder.mkdir()
            app = _app(args.app, args.clients, args.rounds, machines or args.clients, folder)
            doc = run(app, args.clients, machines, folder / "r.json")
            later = doc["rounds"][1:] or doc["rounds"]  # round 1 includes process start-up
            rows.append({
                "layout": "flat" if machines == 0 else f"{machines} machines (aggregators)",
                "updates_per_round": statistics.median(r["updates"] for r in doc["rounds"]),
                "mb_up_per_round": statistics.median(r["bytes_up"] for r in doc["rounds"]) / 1e6,
                "seconds_per_round": statistics.median(r["seconds"] for r in later),
                "final_accuracy": doc["final_accuracy"]})
    t = Table(title=f"{args.clients} clients, {args.rounds} rounds, gRPC on 127.0.0.1, what the "
                    f"server receives")
    for col in ("layout", "updates / round", "MB up / round", "s / round (rounds 2+)",
                "final accuracy"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for r in rows:
        t.add_row(r["layout"], f"{r['updates_per_round']:g}", f"{r['mb_up_per_round']:.2f}",
                  f"{r['seconds_per_round']:.2f}", f"{r['final_accuracy']:.4f}")
    Console(width=140).print(t)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""`plinth tune`: share-aware autotuning (TVM MetaSchedule). `show DIR` lists a tuning
database; `run FILE` submits a Tune spec to the control plane (as `plinth submit`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table


app = typer.Typer(help="Tune models at the GPU or CPU share they will run at (SLICE-TUNE).",
                  no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 120)


@app.callback()
def _group() -> None:
    """A Tune spec is submitted with `plinth submit SPEC`; these commands read what it tuned."""


def tune_table(ws: list[dict]) -> Table:
    """Tune tasks as `plinth ls` lists them under the jobs: the shares (cores on a CPU, percent
    of a GPU), how many of the clients are done, and the units running now (`plinth show`
    gives the database)."""
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("TUNE", "TENANT", "STATE", "SHARES", "TRIALS", "CLIENTS", "RUNNING"):
        t.add_column(col, no_wrap=True, justify="right" if col in (
            "TRIALS", "CLIENTS", "RUNNING") else "left")
    for w in ws:
        st, units = w["status"], w["units"]
        unit = " cores" if st.get("target") == "cpu" else "%"
        clients = len(st.get("shares", [])) * int(st.get("clients_per_share", 1))
        done = sum(u["unit"].startswith("client-") and u["state"] == "succeeded" for u in units)
        t.add_row(w["name"], w["tenant"], w["state"],
                  ", ".join(f"{s:g}" for s in st.get("shares", [])) + unit,
                  str(st.get("trials", "-")), f"{done}/{clients}",
                  str(sum(u["state"] == "running" for u in units)))
    return t


@app.command("show")
def show(db: Annotated[Path, typer.Argument(help="A tuning database folder (a Tune spec's "
                                                 "db).")]) -> None:
    """What is tuned in a database: each model and target, at which shares, how much."""
    from plinth.core.errors import PlinthError
    from plinth.tune.db import listing

    if not db.is_dir():
        raise PlinthError(f"{db}: no such tuning database (a folder)")
    entries = listing(db)
    if not entries:
        console.print(f"{db}: nothing tuned yet", highlight=False)
        return
    t = Table(title=f"tuned in {db}")
    for col in ("model", "target", "share", "tasks", "records", "shards", "tuning s"):
        t.add_column(col, justify="left" if col in ("model", "target") else "right")
    for e in entries:
        unit = " cores" if e.target == "cpu" else "%"
        t.add_row(e.model, e.target, f"{e.share:g}{unit}", str(e.tasks), str(e.records),
                  str(e.shards), "-" if e.seconds is None else f"{e.seconds:,.0f}")
    console.print(t)

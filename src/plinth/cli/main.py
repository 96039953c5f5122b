"""The `plinth` command line."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console

import plinth
from plinth.cli import export as export_cmd
from plinth.cli import fl as fl_cmd
from plinth.cli import place as place_cmd
from plinth.cli import platform as platform_cmd
from plinth.cli import quickstart as quickstart_cmd
from plinth.cli import serve as serve_cmd
from plinth.cli import sim as sim_cmd
from plinth.cli import tune as tune_cmd
from plinth.core.errors import PlinthError

app = typer.Typer(help="Plinth: an ML platform. Run jobs on GPUs, simulate schedulers, "
                       "federate learning.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.command("sim")(sim_cmd.sim)
app.command("demo")(sim_cmd.demo)
app.command("policies")(sim_cmd.policies)
for _name in ("up", "submit", "ls", "show", "logs", "cancel", "nodes", "top"):
    app.command(_name)(getattr(platform_cmd, _name))
app.add_typer(platform_cmd.tenant_app, name="tenant")
app.command("quickstart")(quickstart_cmd.quickstart)
app.command("place")(place_cmd.place)
app.command("export")(export_cmd.export)
app.add_typer(serve_cmd.app, name="serve")
app.add_typer(fl_cmd.app, name="fl")
app.add_typer(tune_cmd.app, name="tune")

err = Console(stderr=True)


def _version(show: bool) -> None:
    if show:
        typer.echo(f"plinth {plinth.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """Plinth: an ML platform. Run jobs on GPUs, simulate schedulers, federate learning."""


def main() -> None:
    """Entry point: Typer handles usage errors; a PlinthError is one red line, exit code 2."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except PlinthError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""`plinth place MODULE:FACTORY`: profile a model, place it on memory-limited devices, save the plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 120)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def report(plan) -> Table:
    """The per-device table: memory against the cap."""
    t = Table(title=f"{plan.algo} on {len(plan.devices)} devices · step "
                    f"{plan.predicted_step_time_s * 1e3:,.1f} ms predicted "
                    f"(one device, unlimited memory: {plan.single_device_step_time_s * 1e3:,.1f} ms)")
    t.add_column("device")
    t.add_column("operators", justify="right")
    t.add_column("peak memory", justify="right")
    t.add_column("of cap", justify="right")
    counts = [0] * len(plan.devices)
    for d in plan.assign.values():
        counts[d] += 1
    for i, name in enumerate(plan.devices):
        peak = plan.peak_memory_bytes[i]
        t.add_row(name, f"{counts[i]:,}", _gib(peak), f"{peak / plan.memory_bytes:.0%}")
    return t


def place(
    target: Annotated[str, typer.Argument(metavar="MODULE:FACTORY",
                                          help="Model factory, e.g. plinth.place.models:gnmt.")],
    devices: Annotated[int, typer.Option(help="Number of devices.")] = 4,
    memory: Annotated[str, typer.Option(help="Memory per device, e.g. 16GiB.")] = "16GiB",
    algo: Annotated[str, typer.Option(help="m-etf | m-sct | m-topo")] = "m-etf",
    batch: Annotated[int, typer.Option(help="Training batch size to plan for.")] = 64,
    profile_batch: Annotated[int | None, typer.Option(
        help="Batch to profile at (costs are scaled to --batch); default min(batch, 8).")] = None,
    comm: Annotated[str, typer.Option(help="measure (copies between local devices) | pcie | "
                                           "nvlink")] = "measure",
    json_path: Annotated[str | None, typer.Option("--json", help="Write the figures as JSON.")]
    = None,
    out: Annotated[str, typer.Option(help="Where to write the plan (its folder is made).")
                   ] = "results/plan.json",
) -> None:
    """Profile a model, place its operator graph on memory-limited devices, and save the plan."""
    from plinth.place import parse_size
    from plinth.place.factory import plan_target

    mem = parse_size(memory, field_name="--memory")
    with console.status(f"profiling and placing {target}"):
        plan = plan_target(target, devices=devices, memory_bytes=mem, algo=algo, batch=batch,
                           profile_batch=profile_batch, comm=comm,
                           on_note=lambda n: console.print(f"[yellow]note:[/yellow] {n}"))
    console.print(report(plan))
    console.print(f"graph: {plan.nodes_before:,} operators, {plan.nodes_after:,} after coarsening"
                  f" · placement took {plan.placement_time_s:.3f} s · comm {plan.comm}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    plan.save(out)
    console.print(f"plan: {out}")
    if json_path:
        Path(json_path).write_text(json.dumps(plan.metrics(), indent=1))
        console.print(f"results: {json_path}")

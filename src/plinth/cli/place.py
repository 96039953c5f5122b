"""`plinth place MODULE:FACTORY`: profile a model, place it on memory-limited devices, save the plan."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from plinth.core.errors import SpecError

console = Console(width=None if sys.stdout.isatty() else 120)


def load_factory(target: str):
    """The factory named by ``package.module:function``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(f"MODULE:FACTORY: expected something like "
                        f"plinth.place.models:transformer, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SpecError(f"MODULE:FACTORY: cannot import module {module_name!r} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SpecError(f"MODULE:FACTORY: module {module_name!r} has no factory {attr!r}")
    return factory


def build(factory, batch: int, target: str):
    """Call the factory; it returns (module, example_inputs)."""
    import torch

    built = factory(batch=batch)
    if (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module)):
        model, inputs = built
        return model, inputs if isinstance(inputs, tuple) else (inputs,)
    raise SpecError(f"MODULE:FACTORY: {target} must return (module, example_inputs), "
                    f"got {type(built).__name__}")


def _comm(kind: str):
    from plinth.place import comm

    if kind == "measure":
        return comm.measure_local()
    presets = {"pcie": comm.PCIE, "nvlink": comm.NVLINK}
    if kind not in presets:
        raise SpecError(f"--comm: expected measure, pcie or nvlink, got {kind!r}")
    return presets[kind]


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
    out: Annotated[str, typer.Option(help="Where to write the plan.")] = "plan.json",
) -> None:
    """Profile a model, place its operator graph on memory-limited devices, and save the plan."""
    from plinth.place import Devices, parse_size, placer, plan_graph, profile

    mem = parse_size(memory, field_name="--memory")
    devs = Devices.uniform(devices, mem)
    placer(algo)  # an unknown name fails before any work
    if batch < 1:
        raise SpecError(f"--batch: must be at least 1 (got {batch})")
    pb = profile_batch or min(batch, 8)
    if pb < 1 or pb > batch:
        raise SpecError(f"--profile-batch: must be between 1 and --batch ({batch}), got {pb}")
    model, inputs = build(load_factory(target), pb, target)
    link = _comm(comm)
    with console.status(f"profiling {target} at batch {pb}"):
        prof = profile(model, inputs, scale=batch / pb)
    for note in prof.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    import torch

    names = ([f"cuda:{i}" for i in range(devices)] if torch.cuda.device_count() >= devices
             else [f"device:{i}" for i in range(devices)])
    plan = plan_graph(prof.graph, devs, link, algo=algo, device_names=names, notes=prof.notes)
    console.print(report(plan))
    console.print(f"graph: {plan.nodes_before:,} operators, {plan.nodes_after:,} after coarsening"
                  f" · placement took {plan.placement_time_s:.3f} s · comm {plan.comm}")
    plan.save(out)
    console.print(f"plan: {out}")
    if json_path:
        Path(json_path).write_text(json.dumps(plan.metrics(), indent=1))
        console.print(f"results: {json_path}")

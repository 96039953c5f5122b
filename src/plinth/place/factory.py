"""Build a model from a ``MODULE:FACTORY`` name and plan it: what `plinth place` and the
platform's placement step for a job (`plinth.place.for_job`) share."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from plinth.core.errors import SpecError
from plinth.core.registry import Registry


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


# --comm: the link between devices, measured here or a preset.
COMM_MODELS: Registry[Callable[[], Any]] = Registry("comm model", field="--comm")
COMM_MODELS.add("measure", "plinth.place.comm:measure_local")
COMM_MODELS.add("pcie", "plinth.place.comm:pcie")
COMM_MODELS.add("nvlink", "plinth.place.comm:nvlink")


def comm_model(kind: str):
    return COMM_MODELS.make(kind)


def plan_target(target: str, *, devices: int, memory_bytes: int, algo: str = "m-etf",
                batch: int = 64, profile_batch: int | None = None, comm: str = "measure",
                on_note=None):
    """Profile the model `target` builds at a small batch, scale its costs to `batch`, and
    place it on `devices` devices of `memory_bytes` each. Returns the Plan."""
    from plinth.place import Devices, placer, plan_graph, profile

    devs = Devices.uniform(devices, memory_bytes)
    placer(algo)  # an unknown name fails before any work
    COMM_MODELS.check(comm)
    if batch < 1:
        raise SpecError(f"--batch: must be at least 1 (got {batch})")
    pb = profile_batch or min(batch, 8)
    if pb < 1 or pb > batch:
        raise SpecError(f"--profile-batch: must be between 1 and --batch ({batch}), got {pb}")
    model, inputs = build(load_factory(target), pb, target)
    link = comm_model(comm)
    prof = profile(model, inputs, scale=batch / pb)
    for note in prof.notes:
        if on_note is not None:
            on_note(note)
    import torch

    names = ([f"cuda:{i}" for i in range(devices)] if torch.cuda.device_count() >= devices
             else [f"device:{i}" for i in range(devices)])
    return plan_graph(prof.graph, devs, link, algo=algo, device_names=names, notes=prof.notes)

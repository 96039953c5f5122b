"""A model to tune: a torch module imported through TVM's Relax frontend, and its tuning tasks.

A model is named as `MODULE:FACTORY` (a function returning a `torch.nn.Module`, called with no
arguments) or as the path of a file written by `torch.export.save` (`.pt2`). It is exported
with a random input of `input_shape`, imported by `from_exported_program`, and lowered to
fused TIR functions: each distinct one is a MetaSchedule tuning task. The same lowering is
used to extract tasks and to compile with tuned records, so that their keys match.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_UNSUPPORTED = re.compile(r"Unsupported function types (\[.*?\])")


class ImportFailed(ValueError):
    """TVM cannot import the model; the message says which operators it lacks."""


@dataclass(frozen=True, slots=True)
class Task:
    """One tuning task of a model: a fused TIR function, with how often the model calls it."""

    name: str
    weight: int
    flops: float


def load_torch(model: str) -> Any:
    """The torch module (eval mode) of a `MODULE:FACTORY` name."""
    module, _, attr = model.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    return factory().eval()


def export(model: str, input_shape: Sequence[int]) -> Any:
    """The `torch.export` program of a model at one input shape (a `.pt2` file is read as is)."""
    import torch

    if model.endswith(".pt2"):
        return torch.export.load(model)
    # The factory first: under a seed, a factory that initialises at random then gives the
    # weights it gives without the export (a Service's replica seeds torch so, plinth.serve.tuned).
    net = load_torch(model)
    example = torch.randn(*input_shape)
    with torch.no_grad():
        return torch.export.export(net, (example,))


@functools.lru_cache(maxsize=8)
def relax_module(model: str, input_shape: tuple[int, ...]) -> Any:
    """The model as a Relax IRModule, its weights bound as constants; `ImportFailed` names the
    operators the frontend lacks."""
    from tvm.relax.frontend.torch import from_exported_program

    program = export(model, input_shape)
    try:
        return from_exported_program(program, unwrap_unit_return_tuple=True)
    except (AssertionError, ValueError, NotImplementedError, KeyError) as e:
        raise ImportFailed(_why(e)) from None


def _why(e: Exception) -> str:
    m = _UNSUPPORTED.search(str(e))
    if m is None:
        return f"TVM's Relax frontend cannot import it: {str(e).splitlines()[0][:200]}"
    ops = sorted(ast.literal_eval(m.group(1)))
    return f"TVM's Relax frontend has no converter for operator {', '.join(ops)}"


def lower(mod: Any, target: Any) -> Any:
    """`mod` legalized and fused to TIR, as MetaSchedule's task extraction and compile expect."""
    import tvm
    from tvm.relax import transform as T

    with tvm.target.Target(target):
        return tvm.transform.Sequential([
            T.DecomposeOpsForInference(),
            T.CanonicalizeBindings(),
            T.LegalizeOps(),
            T.AnnotateTIROpPattern(),
            T.FoldConstant(),
            T.FuseOps(),
            T.FuseTIR(),
        ])(mod)


def extract(model: str, input_shape: Sequence[int], target: Any) -> tuple[Any, list[Any]]:
    """(lowered module, MetaSchedule's extracted tasks) in the order TVM gives them."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    lowered = lower(relax_module(model, tuple(input_shape)), target)
    return lowered, list(ms.relax_integration.extract_tasks(lowered, tvm.target.Target(target)))


def describe(tasks: Sequence[Any]) -> list[Task]:
    """Name, weight and estimated FLOPs of each extracted task (for sharding and display)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for t in tasks:
        try:
            flops = float(estimate_tir_flops(t.dispatched[0]))
        except (RuntimeError, ValueError, TypeError):  # TVM cannot estimate some: count 1
            flops = 1.0
        out.append(Task(t.task_name, int(t.weight), max(flops, 1.0)))
    return out


def example_input(input_shape: Sequence[int], seed: int = 0) -> Any:
    """A fixed random input (float32) for measuring a compiled model."""
    import numpy as np

    return np.random.default_rng(seed).standard_normal(tuple(input_shape)).astype("float32")

"""Carry out a plan: a copy of the model whose parts sit on their devices, with transfers.

For an fx-traced plan, the model is traced again (the same tracer gives the same operator names),
each module and parameter moves to its operator's device, and a copy to the consumer's device is
inserted on every edge that crosses devices: once per tensor and device, so a tensor received once
is reused. For a hook-traced plan, each leaf module moves to its device and a pre-hook brings its
inputs there. Either way the outputs come back to the device the model started on, so they equal
the original model's outputs.
"""

from __future__ import annotations

import copy

import torch
from torch import fx, nn

from plinth.core.errors import SpecError
from plinth.place.graph import fx_trace
from plinth.place.plan import Plan
from plinth.place.profile import leaf_modules


def to_device(value, device: str):
    """Move every tensor in a (nested) value; anything else passes through."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(to_device(v, device) for v in value)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value



def _home(model: nn.Module) -> str:
    for p in model.parameters():
        return str(p.device)
    return "cpu"


def _index(plan: Plan, name: str) -> int:
    try:
        return plan.assign[name]
    except KeyError:
        raise SpecError(f"plan: operator {name!r} has no device; the plan was made for another "
                        "model (or another version of it)") from None


def _move_attr(gm: fx.GraphModule, target: str, device: str) -> None:
    owner_path, _, attr = target.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    value = getattr(owner, attr)
    if isinstance(value, nn.Parameter):
        value.data = value.data.to(device)   # keeps the Parameter, so optimisers still see it
    elif isinstance(value, torch.Tensor):
        setattr(owner, attr, value.to(device))


def apply(model: nn.Module, plan: Plan) -> nn.Module:
    """A placed copy of `model` (the original is left as it is)."""
    home = _home(model)
    model = copy.deepcopy(model)
    if plan.tracer == "hooks":
        return _apply_hooks(model, plan, home)
    gm = fx_trace(model)
    # Devices are compared by their index in the plan, so that a plan whose devices share a
    # name (every one "cpu" in a test) still gets its transfers.
    where: dict[fx.Node, int] = {}
    moved: dict[tuple[fx.Node, int], fx.Node] = {}
    owner: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if node.op == "placeholder":
            where[node] = -1
            continue
        index = -1 if node.op == "output" else _index(plan, node.name)
        if node.op == "call_module":
            # A module called more than once runs every call where its first call was placed:
            # its weights live in one place.
            index = owner.setdefault(str(node.target), index)
        device = home if index < 0 else plan.devices[index]
        where[node] = index
        if node.op == "call_module":
            gm.get_submodule(str(node.target)).to(device)
        elif node.op == "get_attr":
            _move_attr(gm, str(node.target), device)
        for a in list(node.all_input_nodes):
            if where[a] == index:
                continue
            if (a, index) not in moved:
                with gm.graph.inserting_after(a):
                    moved[(a, index)] = gm.graph.call_function(to_device, (a, device))
            node.replace_input_with(a, moved[(a, index)])
    gm.graph.lint()
    gm.recompile()
    gm.plinth_transfers = len(moved)  # how many copies the placed model makes per step
    return gm


def _apply_hooks(model: nn.Module, plan: Plan, home: str) -> nn.Module:
    transfers = 0
    for path, module in leaf_modules(model):
        if path not in plan.assign:
            continue  # a module the profiled run never called
        device = plan.devices[_index(plan, path)]
        module.to(device)
        module.register_forward_pre_hook(lambda m, args, d=device: to_device(args, d))
        transfers += 1
    model.register_forward_hook(lambda m, args, out: to_device(out, home))
    model.plinth_transfers = transfers
    return model

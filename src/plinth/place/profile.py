"""Profile a model on the local device: compute time and memory per operator.

This is the I/O shell around the pure placers: it runs the model and reads the clock. Costs are
measured at a small `profile_batch` and scaled linearly to the target batch (activations scale
exactly with the batch; compute times do to a good first order), so that a GPT-2-sized model can be
profiled on a CPU in seconds.

Backward times are not measured per operator: one whole fwd+bwd pass gives the backward/forward
ratio, and every operator's backward time is its forward time times that ratio.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx, nn

from plinth.place.graph import OpGraph, fx_trace, is_atomic, placeable, tensor_bytes, tensors_in


@dataclass(slots=True)
class Profiled:
    """A profiled graph and what the user should be told about how it was obtained."""

    graph: OpGraph
    notes: list[str] = field(default_factory=list)
    bwd_ratio: float = 2.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(model: nn.Module, inputs: tuple) -> torch.device:
    for p in model.parameters():
        return p.device
    ts = tensors_in(inputs)
    return ts[0].device if ts else torch.device("cpu")


def _scalar(out: object) -> torch.Tensor | None:
    parts = [t.float().mean() for t in tensors_in(out) if t.requires_grad]
    return sum(parts) if parts else None  # type: ignore[return-value]


def backward_ratio(model: nn.Module, inputs: tuple, *, repeats: int = 1) -> float:
    """Measured backward time / forward time of one whole step, clipped to [1, 3]."""
    device = _device_of(model, inputs)
    fwd, bwd = [], []
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        _sync(device)
        t0 = time.perf_counter()
        loss = _scalar(model(*inputs))
        _sync(device)
        t1 = time.perf_counter()
        if loss is None:
            return 2.0
        loss.backward()
        _sync(device)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    model.zero_grad(set_to_none=True)
    ratio = statistics.median(bwd[1:]) / max(statistics.median(fwd[1:]), 1e-9)
    return float(np.clip(ratio, 1.0, 3.0))


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _is_view(out: object, args: list[torch.Tensor]) -> bool:
    """The output shares storage with an input: it allocates nothing new."""
    outs = tensors_in(out)
    ptrs = {a.untyped_storage().data_ptr() for a in args if a.numel()}
    return bool(outs) and all(o.numel() == 0 or o.untyped_storage().data_ptr() in ptrs
                              for o in outs)


class _TimingInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, repeats: int, device: torch.device) -> None:
        super().__init__(gm)
        self.repeats, self.device = repeats, device
        self.times: dict[str, float] = {}
        self.outs: dict[str, tuple[int, bool, bool]] = {}  # bytes, view, requires grad

    def run_node(self, n: fx.Node):
        if not placeable(n):
            return super().run_node(n)
        samples = []
        result = None
        for _ in range(self.repeats):
            _sync(self.device)
            t = time.perf_counter()
            result = super().run_node(n)
            _sync(self.device)
            samples.append(time.perf_counter() - t)
        args = [t for a in n.all_input_nodes for t in tensors_in(self.env[a])]
        grad = any(t.requires_grad for t in tensors_in(result))
        self.times[n.name] = min(samples) * 1e6
        self.outs[n.name] = (tensor_bytes(result), _is_view(result, args), grad)
        return result


def _scope(n: fx.Node) -> str:
    if n.op in ("call_module", "get_attr"):
        return str(n.target)
    stack = n.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def profile_fx(model: nn.Module, inputs: tuple, *, repeats: int = 2, scale: float = 1.0,
               bwd_ratio: float = 2.0) -> OpGraph:
    """Trace with fx and time every operator with real inputs."""
    gm = fx_trace(model)
    device = _device_of(model, inputs)
    interp = _TimingInterpreter(gm, repeats, device)
    interp.run(*inputs)
    nodes = [n for n in gm.graph.nodes if placeable(n)]
    index = {n.name: i for i, n in enumerate(nodes)}
    fwd, params, act, temp, out = [], [], [], [], []
    for n in nodes:
        nbytes, view, grad = interp.outs[n.name]
        if n.op == "call_module":
            params.append(_param_bytes(gm.get_submodule(str(n.target))))
        elif n.op == "get_attr":
            params.append(nbytes if grad else 0)  # a free-standing parameter
        else:
            params.append(0)
        is_param = n.op == "get_attr"
        fwd.append(interp.times[n.name] * scale)
        act.append(0 if (view or not grad or is_param) else int(nbytes * scale))
        temp.append(0 if (not grad or is_param) else int(nbytes * scale))
        out.append(int(nbytes if is_param else nbytes * scale))
    edges = sorted({(index[a.name], index[n.name]) for n in nodes for a in n.all_input_nodes
                    if a.name in index})
    src = np.array([u for u, _ in edges], dtype=np.int64)
    dst = np.array([v for _, v in edges], dtype=np.int64)
    out_arr = np.array(out, dtype=np.int64)
    fwd_arr = np.array(fwd)
    return OpGraph([n.name for n in nodes], fwd_arr, fwd_arr * bwd_ratio, params, act, temp,
                   out_arr, src, dst, out_arr[src] if len(src) else src,
                   [(n.name,) for n in nodes], [_scope(n) for n in nodes], tracer="fx")


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules a hook-traced graph is made of: atomic modules and childless ones."""
    found: list[tuple[str, nn.Module]] = []

    def walk(prefix: str, m: nn.Module) -> None:
        children = list(m.named_children())
        if prefix and (is_atomic(m) or not children):
            found.append((prefix, m))
            return
        for name, c in children:
            walk(f"{prefix}.{name}" if prefix else name, c)

    walk("", model)
    return found


def profile_hooks(model: nn.Module, inputs: tuple, *, scale: float = 1.0,
                  bwd_ratio: float = 2.0) -> OpGraph:
    """Module-level graph for models fx cannot trace: one node per leaf module call, in the order
    the modules ran; an edge wherever a module's output is another's input. A module whose input
    came from no recorded module (it went through plain tensor code) is linked to the module that
    ran just before it, so the order the model ran in is kept."""
    device = _device_of(model, inputs)
    names, fwd, params, act, out, scopes = [], [], [], [], [], []
    edges: dict[tuple[int, int], int] = {}
    producer: dict[int, int] = {}
    keep: list[torch.Tensor] = []  # keeps ids unique while tracing
    started: dict[str, float] = {}
    handles = []
    counts: dict[str, int] = {}

    def pre(path):
        def hook(mod, args):
            _sync(device)
            started[path] = time.perf_counter()
        return hook

    def post(path):
        def hook(mod, args, result):
            _sync(device)
            took = time.perf_counter() - started[path]
            i = len(names)
            k = counts.get(path, 0)
            counts[path] = k + 1
            names.append(path if k == 0 else f"{path}#{k}")
            scopes.append(path)
            fwd.append(took * 1e6 * scale)
            params.append(_param_bytes(mod) if k == 0 else 0)  # shared weights count once
            nbytes = tensor_bytes(result)
            act.append(int(nbytes * scale))
            out.append(int(nbytes * scale))
            linked = False
            for t in tensors_in(args):
                u = producer.get(id(t))
                if u is not None:
                    edges[(u, i)] = max(edges.get((u, i), 0), int(tensor_bytes(t) * scale))
                    linked = True
            if not linked and i > 0:
                edges[(i - 1, i)] = int(tensor_bytes(args) * scale)
            for t in tensors_in(result):
                producer[id(t)] = i
                keep.append(t)
        return hook

    for path, m in leaf_modules(model):
        handles.append(m.register_forward_pre_hook(pre(path)))
        handles.append(m.register_forward_hook(post(path)))
    try:
        model(*inputs)
    finally:
        for h in handles:
            h.remove()
    pairs = sorted(edges)
    fwd_arr = np.array(fwd, dtype=np.float64)
    return OpGraph(names, fwd_arr, fwd_arr * bwd_ratio, params, act, act, out,
                   [u for u, _ in pairs], [v for _, v in pairs], [edges[p] for p in pairs],
                   [(s,) for s in scopes], scopes, tracer="hooks")


def profile(model: nn.Module, inputs: tuple, *, repeats: int = 2, scale: float = 1.0,
            tracer: str = "auto") -> Profiled:
    """Profile `model` on `inputs` (on whatever device they are on). `tracer` is ``fx``,
    ``hooks`` or ``auto`` (fx, falling back to module hooks where fx cannot trace)."""
    notes: list[str] = []
    ratio = backward_ratio(model, inputs)
    graph = None
    if tracer in ("auto", "fx"):
        try:
            graph = profile_fx(model, inputs, repeats=repeats, scale=scale, bwd_ratio=ratio)
        except Exception as e:  # fx raises many types on untraceable code
            if tracer == "fx":
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            notes.append(f"torch.fx could not trace the model ({type(e).__name__}: {first[:120]});"
                         " fell back to module-level hooks, so tensor code between modules is "
                         "not placed separately")
    if graph is None:
        graph = profile_hooks(model, inputs, scale=scale, bwd_ratio=ratio)
    if scale != 1.0:
        notes.append(f"profiled at a smaller batch; activations and times scaled by {scale:g}")
    return Profiled(graph, notes, ratio)

"""The user's model and handler, loaded from a reference, and checked once at submit time.

A model reference (`model:` in a Service spec, `--model` of a replica) is one of:

- a built-in name (`tiny-cnn`, `mlp`; see `plinth.serve.models.MODELS`), seeded so every replica
  answers the same;
- ``MODULE:FACTORY``: MODULE is imported with the service's workdir on `sys.path`, and FACTORY()
  returns a `torch.nn.Module`;
- a file: ``*.pt2`` is a `torch.export` archive, anything else a TorchScript file.

A handler (``MODULE:NAME``, optional) turns a JSON payload into a batch tensor and the outputs back
into JSON. Without one, ``{"inputs": nested list}`` is the batch and the answer is
``{"outputs": ..., "classes": ...}`` (classes: the argmax of 2-D logits).

`check_model` is the submit-time check: it loads the model and times one example in a child
process (for a Service's `tuned:` model, the TVM build a replica serves: `plinth.serve.tuned`).
Every failure a user can cause is a one-line `SpecError` that starts with the field at fault.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from plinth.core.errors import SpecError
from plinth.serve.models import MODELS

SIDE = 28
_FACTORY_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Forward = Callable[[torch.Tensor], torch.Tensor]


# --- the built-in models (registered in plinth.serve.models.MODELS) ------------------------------


def tiny_cnn() -> torch.nn.Module:
    """A two-layer CNN on flattened 28x28 rows (input shape 784)."""
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, SIDE, SIDE)),
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


def mlp() -> torch.nn.Module:
    """A one-hidden-layer MLP on flattened 28x28 rows (input shape 784)."""
    return torch.nn.Sequential(torch.nn.Linear(SIDE * SIDE, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


# --- loading ------------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _import_attr(ref: str, field: str, workdir: str | None) -> Any:
    """MODULE:ATTR, imported with `workdir` first on sys.path (it stays there: a factory may
    import its siblings lazily)."""
    module, attr = ref.split(":")
    if workdir is not None:
        path = str(Path(workdir).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # a user's module can raise anything on import
        raise SpecError(f"{field}: cannot import {module}: {_first_line(e)}") from e
    try:
        return getattr(mod, attr)
    except AttributeError as e:
        raise SpecError(f"{field}: {module} has no attribute {attr!r}") from e


def _eval(net: torch.nn.Module) -> torch.nn.Module:
    try:
        net.eval()
    except NotImplementedError:
        pass  # a torch.export module has no train mode to leave
    return net


def load_model(ref: str, *, workdir: str | None = None) -> torch.nn.Module:
    """The model `ref` names, in eval mode (see the module docstring for the forms of `ref`)."""
    if ref in MODELS:
        torch.manual_seed(0)
        return _eval(MODELS.make(ref))
    if _FACTORY_REF.match(ref):
        factory = _import_attr(ref, "model", workdir)
        if not callable(factory):
            raise SpecError(f"model: {ref} is a {type(factory).__name__}, not a factory")
        try:
            net = factory()
        except Exception as e:
            raise SpecError(f"model: factory {ref} raised {_first_line(e)}") from e
        if not isinstance(net, torch.nn.Module):
            raise SpecError(f"model: factory {ref} returned {type(net).__name__}, "
                            f"not a torch.nn.Module")
        return _eval(net)
    path = Path(ref)
    if workdir is not None and not path.is_absolute():
        path = Path(workdir) / path
    if not path.is_file():
        if path.suffix:
            raise SpecError(f"model: no such file {ref!r}")
        raise SpecError(f"model: {ref!r} is not a built-in model ({', '.join(MODELS)}), "
                        f"a MODULE:FACTORY reference or a file")
    try:
        if path.suffix == ".pt2":
            return _eval(torch.export.load(str(path)).module())
        with warnings.catch_warnings():  # deprecated, but the user chose the format
            warnings.simplefilter("ignore", DeprecationWarning)
            return _eval(torch.jit.load(str(path), map_location="cpu"))
    except Exception as e:
        kind = "torch.export" if path.suffix == ".pt2" else "TorchScript"
        raise SpecError(f"model: cannot load {ref!r} as a {kind} file: {_first_line(e)}") from e


# --- handlers -----------------------------------------------------------------------------------


class Handler(Protocol):
    def preprocess(self, payload: Any) -> torch.Tensor: ...
    def postprocess(self, outputs: torch.Tensor) -> Any: ...


class DefaultHandler:
    """{"inputs": nested list} in as a float32 batch; {"outputs": list} out, plus "classes"
    (the argmax) when the outputs are 2-D logits."""

    def preprocess(self, payload: Any) -> torch.Tensor:
        if not isinstance(payload, dict) or "inputs" not in payload:
            raise ValueError('inputs: expected a JSON object {"inputs": [...]}')
        try:
            return torch.tensor(payload["inputs"], dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"inputs: not a rectangular list of numbers ({e})") from e

    def postprocess(self, outputs: torch.Tensor) -> Any:
        out: dict[str, Any] = {"outputs": outputs.tolist()}
        if outputs.ndim == 2:
            out["classes"] = outputs.argmax(dim=1).tolist()
        return out


def load_handler(ref: str | None, *, workdir: str | None = None) -> Handler:
    """The handler `ref` (``MODULE:NAME``) names; a class is instantiated with no arguments.
    None gives the `DefaultHandler`."""
    if ref is None:
        return DefaultHandler()
    if not _FACTORY_REF.match(ref):
        raise SpecError(f"handler: expected MODULE:NAME, got {ref!r}")
    obj = _import_attr(ref, "handler", workdir)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as e:
            raise SpecError(f"handler: {ref}() raised {_first_line(e)}") from e
    for method in ("preprocess", "postprocess"):
        if not callable(getattr(obj, method, None)):
            raise SpecError(f"handler: {ref} has no {method} method")
    return obj


# --- running and checking -----------------------------------------------------------------------


def forward_fn(net: torch.nn.Module, device: str = "cpu") -> Forward:
    """`net` as a function batch -> outputs, without autograd bookkeeping, run on `device`
    (inputs and outputs stay on the CPU); a model whose output is not one tensor raises
    TypeError (the replica can only split a tensor by request)."""
    net = net.to(device)

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            y = net(x.to(device))
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"the model returned {type(y).__name__}, not a torch.Tensor")
        return y.cpu()
    return forward


def replica_device() -> str:
    """The GPU (share) the runtime gave this replica, if any: it sets CUDA_VISIBLE_DEVICES, and
    for a gpu_fraction the MPS thread percentage and memory limit, before the process starts."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("", "-1") and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def parse_shape(text: str) -> tuple[int, ...]:
    """'1,28,28' -> (1, 28, 28): one example's shape, without the batch dimension."""
    try:
        shape = tuple(int(s) for s in text.replace(" ", "").split(","))
    except ValueError:
        raise SpecError(f"input_shape: expected positive integers like 1,28,28, "
                        f"got {text!r}") from None
    if not shape or min(shape) < 1:
        raise SpecError(f"input_shape: expected positive integers like 1,28,28, got {text!r}")
    return shape


def try_example(forward: Forward, input_shape: tuple[int, ...]) -> torch.Tensor:
    """Run one example of zeros; a refusal is an `input_shape` error."""
    shape = (1, *input_shape)
    try:
        y = forward(torch.zeros(shape))
    except TypeError as e:
        raise SpecError(f"model: {e}") from e
    except Exception as e:
        raise SpecError(f"input_shape: the model refused an input of shape {shape}: "
                        f"{_first_line(e)}") from e
    if y.ndim == 0 or y.shape[0] != 1:
        raise SpecError(f"model: an input of shape {shape} gave outputs of shape "
                        f"{tuple(y.shape)}; the first dimension must be the batch")
    return y

"""TVM targets for a share, and the two work-arounds tuning needs on this TVM (0.27).

- `target_for(kind, share)`: the TVM target dict of a share. On a CPU a share is a core count,
  and the code generator splits parallel loops for `num-cores` of them.
- `light_tensor_intrins(kind)`: TVM registers every tensor intrinsic of every backend (CUDA,
  ROCm, Hexagon, Arm, ...) the first time a `TuneContext` is made; that import took 37-300 s on
  a loaded 2-core machine. Only the target's own family is needed, so the package is put in
  place without its `__init__` and just that family is imported (about 4 s for x86).
- `build_candidate`: the builder's `f_build` without that import, for the same reason: the
  builder starts fresh worker processes, and each would pay it again, past the build timeout.
- `inline_builder()`: a builder that compiles candidates in the client itself, one after
  another. MetaSchedule's LocalBuilder starts a new pool of worker processes for every batch,
  and each imports TVM: 20-50 s a batch on a loaded 2-core machine, more than the compiles.
  Where cores are few, the sharded clients are the parallel builders.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any

TARGETS = ("cpu", "cuda")
_INTRINS = "tvm.s_tir.tensor_intrin"
# The tensor-intrinsic modules a target family may tensorize with.
_FAMILIES = {"cpu": ("dot_product_common", "x86", "arm_cpu"), "cuda": ("cuda",)}


def target_for(kind: str, share: float) -> dict[str, Any]:
    """The TVM target (a dict: the string form is refused by TVM 0.27) of `share` on `kind`."""
    if kind == "cpu":
        return {"kind": "llvm", "num-cores": int(share)}
    if kind == "cuda":
        return {"kind": "cuda", "host": {"kind": "llvm"}}
    raise ValueError(f"target: expected one of {', '.join(TARGETS)}, got {kind!r}")


def light_tensor_intrins(kind: str) -> None:
    """Register only the tensor intrinsics of `kind`'s family (see the module docstring).
    Does nothing when the full package is already imported."""
    if _INTRINS in sys.modules:
        return
    import tvm.s_tir

    pkg = types.ModuleType(_INTRINS)
    pkg.__path__ = [os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")]
    pkg.__package__ = _INTRINS
    sys.modules[_INTRINS] = pkg
    for name in _FAMILIES[kind]:
        setattr(pkg, name, importlib.import_module(f"{_INTRINS}.{name}"))


def build_candidate(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's default build, less its import of every tensor intrinsic."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def inline_builder() -> Any:
    """A MetaSchedule builder that builds in this process (see the module docstring)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    @derived_object
    class InlineBuilder(PyBuilder):
        def build(self, build_inputs: list[Any]) -> list[Any]:
            out = []
            for b in build_inputs:
                try:
                    out.append(BuilderResult(default_export(
                        build_candidate(b.mod, b.target, None)), None))
                except (RuntimeError, ValueError, TypeError) as e:  # a candidate that fails
                    out.append(BuilderResult(None, f"InlineBuilder: {e}"))  # is data
            return out

    return InlineBuilder()


def gpu_count() -> int:
    """NVIDIA GPUs the driver reports (0 without a driver)."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver library, no driver: no GPU to tune on
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()

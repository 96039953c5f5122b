"""A Service's tuned model (`tuned: {db, target}`): built by TVM with the records a `kind: Tune`
task tuned at the share nearest the replica's own, and run on the Relax VM instead of torch.

SLICE-TUNE's point (Dhakal et al., Middleware'22): a model gives its best latency at about the
share it was tuned at, so tune at the share you serve at. A replica's share is counted as a Tune
task counts it: on `cpu` its threads (OMP_NUM_THREADS, which the platform sets from its CPUs),
on `cuda` its MPS thread percentage (100 without MPS).

A Tune task tunes the whole model input, batch dimension included; a Service's `input_shape` is
one request's. So a service of `input_shape: [3, 32, 32]` serves the records tuned at
`input_shape: [1, 3, 32, 32]`, and the replica runs a batch one example at a time.

`check_tuned` (submit time, and the control plane's status) only reads the database's folders:
no TVM, no torch, no user code. `tuned_forward` (the replica, and the submit-time check's child)
imports the model and TVM, and builds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plinth.core.errors import SpecError
from plinth.tune.db import model_key, records_for, shares_tuned

if TYPE_CHECKING:
    from plinth.serve.model import Forward

MPS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


@dataclass(frozen=True, slots=True)
class TunedInfo:
    """Which records a replica runs: reported in its /healthz and its startup line."""

    db: str
    target: str
    share: float  # the replica's own
    tuned_at: float  # the share its records were tuned at (the nearest one tuned)
    shares: tuple[float, ...]  # every share the model is tuned at on this target
    records: int

    def as_json(self) -> dict[str, Any]:
        return {"db": self.db, "target": self.target, "share": self.share,
                "tuned_at": self.tuned_at, "shares": list(self.shares), "records": self.records}

    def line(self) -> str:
        return (f"records tuned at share {self.tuned_at:g} for replica share {self.share:g} "
                f"(tuned at {_shares(self.shares)}; {self.records} "
                f"records in {self.db})")


def tuned_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """The input shape a Tune task tuned: one request's, with a batch of one in front."""
    return (1, *(int(d) for d in input_shape))


def _shares(shares: Sequence[float]) -> str:
    return ", ".join(f"{s:g}" for s in sorted(shares))


def check_tuned(db: str, model: str, input_shape: Sequence[int], target: str,
                share: float) -> TunedInfo:
    """The records a replica at `share` would run, or a one-line `SpecError` naming the field:
    no such database, the model not tuned there at this shape, or not on this target."""
    root = Path(db)
    if not root.is_dir():
        raise SpecError(f"tuned.db: no such folder {db!r}")
    shape = tuned_shape(input_shape)
    key = model_key(model, shape)
    if not (root / key).is_dir():
        held = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name[0] != ".")
        raise SpecError(f"tuned.db: {db} has no tuning of {model} at input shape "
                        f"{list(shape)} (a Tune task's input_shape); it holds "
                        f"{', '.join(held) if held else 'nothing'}")
    rec = records_for(db, key, target, share)
    if rec is None:
        other = {t.name: shares_tuned(db, key, t.name) for t in sorted((root / key).iterdir())
                 if t.is_dir() and t.name != target}
        where = "; ".join(f"on {t} at shares {_shares(s)}" for t, s in other.items() if s)
        raise SpecError(f"tuned.target: {model} at input shape {list(shape)} is not tuned on "
                        f"{target} in {db}" + (f"; it is tuned {where}" if where else
                                               " (no records at any share)"))
    return TunedInfo(str(db), target, float(share), rec.share,
                     tuple(sorted(shares_tuned(db, key, target))), rec.count())


def replica_share(target: str) -> float:
    """This replica's share, from what the runtime gave its process (see the module docstring)."""
    if target == "cuda":
        return float(os.environ.get(MPS_ENV) or 100)
    return float(os.environ.get("OMP_NUM_THREADS") or 1)


def tuned_forward(db: str, model: str, input_shape: Sequence[int], target: str, share: float,
                  *, workdir: str | None = None) -> tuple[Forward, TunedInfo]:
    """The model built with the records tuned nearest `share`, as a function batch -> outputs
    (inputs and outputs are CPU tensors, as `plinth.serve.model.forward_fn`'s), and which records
    it runs. TVM's thread pool gets `share` threads on a cpu target."""
    import numpy as np
    import torch

    from plinth.serve.model import load_model

    info = check_tuned(db, model, input_shape, target, share)
    if target == "cpu":  # read when TVM starts its thread pool, on the first run
        os.environ["TVM_NUM_THREADS"] = str(max(1, int(share)))
    # Loads the factory with `workdir` on sys.path, with the one-line errors of an untuned
    # model; seeded, so that a factory that initialises at random gives every replica the same
    # weights (TVM binds the factory's weights into the build).
    torch.manual_seed(0)
    load_model(model, workdir=workdir)
    torch.manual_seed(0)
    import tvm
    from tvm import relax

    from plinth.tune.build import build

    shape = tuned_shape(input_shape)
    try:
        executable, _ = build(db, model, shape, target, share)
    except Exception as e:  # TVM raises its own kinds; say it in one line
        first = str(e).strip().splitlines()
        raise SpecError(f"tuned: TVM cannot build {model} with the records tuned at share "
                        f"{info.tuned_at:g}: {type(e).__name__}: "
                        f"{first[0][:300] if first else ''}") from e
    dev = tvm.cuda(0) if target == "cuda" else tvm.cpu(0)
    main = relax.VirtualMachine(executable, dev)["main"]

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = []
        for i in range(x.shape[0]):  # the build takes a batch of one (see the module docstring)
            y = main(tvm.runtime.tensor(np.ascontiguousarray(x[i:i + 1].numpy()), dev))
            if not isinstance(y, tvm.runtime.Tensor):
                raise TypeError(f"the model returned {type(y).__name__}, not one tensor")
            rows.append(y.numpy())
        return torch.from_numpy(np.concatenate(rows))

    return forward, info

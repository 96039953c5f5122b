"""From a profiled graph to a placement plan: coarsen, place, simulate. Plans save as JSON.

`plan_graph` is the whole pipeline on a graph; only its stopwatch (the placement time it reports)
reads the clock. The placers it calls are pure.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from plinth.core.errors import SpecError
from plinth.place.algorithms import Devices, Placement, placer
from plinth.place.algorithms.common import check_each_fits
from plinth.place.coarsen import Coarse, coarsen
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph
from plinth.place.simulate import critical_path_us, simulate, single_device

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)
_POWER = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(value: str | int, *, field_name: str = "--memory") -> int:
    """Bytes from ``16GiB``, ``16Gi``, ``512MiB``, ``16GB`` (powers of 1000) or a plain number."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _SIZE.match(str(value))
        if m is None:
            raise SpecError(f"{field_name}: expected a size like 16GiB or 512MiB, got {value!r}")
        base = 1024 if (m.group(3) or not m.group(2)) else 1000
        n = int(float(m.group(1)) * base ** _POWER[m.group(2).upper()])
    if n <= 0:
        raise SpecError(f"{field_name}: must be more than 0 (got {value!r})")
    return n


@dataclass(slots=True)
class Plan:
    """Where each operator goes, and what the simulator predicts for one training step."""

    algo: str
    devices: list[str]
    memory_bytes: int
    assign: dict[str, int]
    tracer: str
    nodes_before: int
    nodes_after: int
    placement_time_s: float
    predicted_step_time_s: float
    single_device_step_time_s: float
    critical_path_s: float
    peak_memory_bytes: list[int]
    comm: str
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    def metrics(self) -> dict:
        """What `--json` writes: the plan's figures without the per-operator assignment."""
        d = asdict(self)
        d.pop("assign")
        d["device_count"] = len(self.devices)
        d["speedup_vs_single"] = (self.single_device_step_time_s
                                  / max(self.predicted_step_time_s, 1e-12))
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(path: str | Path) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
            return Plan(**data)
        except (OSError, ValueError, TypeError) as e:
            raise SpecError(f"plan {path}: cannot read it ({e})") from None


def expand(coarse: Coarse, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """Device and intended order of every original node."""
    return placement.device[coarse.group], placement.order[coarse.group]


def plan_graph(g: OpGraph, devices: Devices, comm: CommModel, *, algo: str = "m-etf",
               device_names: list[str] | None = None, target_nodes: int | None = None,
               notes: list[str] | None = None) -> Plan:
    """Coarsen, place and simulate `g`; the result names every original operator."""
    place = placer(algo)
    t0 = time.perf_counter()
    check_each_fits(g, devices)
    # Merged nodes stay small enough to be balanced: a quarter of a device's memory, and a
    # quarter of a device's share of the work (or the largest original node, if larger).
    work = g.work_us
    max_us = max(float(work.sum()) / (4 * devices.count), float(work.max(initial=0.0)))
    need = g.perm_bytes + g.temp_bytes
    max_bytes = max(min(devices.memory_bytes) / 4, float(need.max(initial=0)))
    coarse = coarsen(g, max_node_bytes=max_bytes, max_node_us=max_us, target_nodes=target_nodes)
    placement = place(coarse.graph, devices, comm)
    took = time.perf_counter() - t0
    device_of, order = expand(coarse, placement)
    step = simulate(g, device_of, comm, devices.count, order=order)
    names = device_names or [f"device:{i}" for i in range(devices.count)]
    assign = {m: int(device_of[i]) for i in range(g.n) for m in g.members[i]}
    return Plan(algo=placement.algo, devices=names, memory_bytes=int(min(devices.memory_bytes)),
                assign=assign, tracer=g.tracer, nodes_before=g.n, nodes_after=coarse.graph.n,
                placement_time_s=took, predicted_step_time_s=step.makespan_s,
                single_device_step_time_s=single_device(g, comm).makespan_s,
                critical_path_s=critical_path_us(g) / 1e6,
                peak_memory_bytes=[int(x) for x in step.peak_bytes], comm=comm.describe(),
                reason=placement.reason, notes=list(notes or []))


def place_model(model, inputs: tuple, *, devices: list[str], memory_bytes: int,
                algo: str = "m-etf", scale: float = 1.0, comm: CommModel | None = None) -> Plan:
    """Profile `model` where it is, then plan it for `devices` (names such as ``cuda:0``) with
    `memory_bytes` each. This is what a training job that asks for a model-parallel placement
    gets for the GPUs it is given; `scale` is the training batch over the batch of `inputs`."""
    from plinth.place.comm import PCIE
    from plinth.place.profile import profile

    devs = Devices.uniform(len(devices), memory_bytes)
    placer(algo)
    prof = profile(model, inputs, scale=scale)
    return plan_graph(prof.graph, devs, comm or PCIE, algo=algo, device_names=list(devices),
                      notes=prof.notes)

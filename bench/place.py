"""Baechi-style placement: placement time and predicted step time, per model and algorithm.

For each representative model (GPT-2-small-like transformer, a 48-layer variant, Inception-V3,
GNMT) the model is profiled once on this machine's CPU at a small batch and scaled to the training
batch. Each device gets 45% of the memory the whole step needs, so that one device cannot hold it
and four can. Each algorithm then coarsens and places the graph; the simulator predicts the step
time, which is compared with one device of unlimited memory and with a hand-written expert split.
A random 10,000-node layered graph measures placement time at the scale of the paper's targets.

    python bench/place.py [--json PATH] [--models transformer,gnmt,...] [--devices 4]
    python bench/place.py --real [--json PATH]   # real step vs prediction on the devices here
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from plinth.place import Devices, models, plan_graph, profile, simulate
from plinth.place.comm import PCIE, measure_local
from plinth.place.graph import OpGraph, layered_dag

ALGOS = ("m-topo", "m-etf", "m-sct")
CAP_FRACTION = 0.45
MODELS = {  # name: (factory, kwargs, training batch, profile batch, expert kind)
    "transformer": (models.transformer, {}, 32, 2, "contiguous"),
    "transformer_deep": (models.transformer_deep, {}, 32, 2, "contiguous"),
    "inception_v3": (models.inception_v3, {}, 32, 2, "contiguous"),
    "gnmt": (models.gnmt, {}, 64, 4, "layers"),
    "gnmt_long": (models.gnmt, {"seq": 64}, 64, 2, "layers"),
}


def _unit(scope: str) -> str:
    """The block an operator belongs to: blocks.3, enc.1, stem, head ..."""
    m = re.match(r"^((?:blocks|enc|dec)\.\d+|[a-z_]+)", scope)
    return m.group(1) if m else ""


def expert(g: OpGraph, kind: str, devices: int) -> np.ndarray:
    """A hand-written split. contiguous: blocks in order, cut where cumulative memory crosses
    each device's share (what people do to make a stack of blocks fit). layers: GNMT's split, encoder
    and decoder layer l on device l * devices / layers, attention with the bottom decoder layer,
    the output projection on the last device."""
    units = [_unit(s) for s in g.scopes]
    if kind == "layers":
        layers = 1 + max(int(u.split(".")[1]) for u in units if u[:4] in ("enc.", "dec."))
        out = np.zeros(g.n, dtype=np.int64)
        for i, u in enumerate(units):
            if u[:4] in ("enc.", "dec."):
                out[i] = int(u.split(".")[1]) * devices // layers
            elif u == "out":
                out[i] = devices - 1
        return out
    order = list(dict.fromkeys(units))
    work = {u: 0.0 for u in order}
    for u, w in zip(units, g.perm_bytes.astype(np.float64)):
        work[u] += w
    cum = np.cumsum([work[u] for u in order])
    cut = np.minimum((cum - np.array([work[u] for u in order]) / 2) / cum[-1] * devices,
                     devices - 1).astype(np.int64)
    where = dict(zip(order, cut.tolist()))
    return np.array([where[u] for u in units], dtype=np.int64)


def bench_model(name: str, n_dev: int, settings, console: Console) -> list[dict]:
    factory, kw, batch, pb, kind = MODELS[name]
    model, inputs = factory(pb, **kw)
    t = time.perf_counter()
    prof = profile(model, inputs, scale=batch / pb, repeats=2)
    prof_s = time.perf_counter() - t
    console.print(f"{name}: {prof.graph.n:,} operators, profiled in {prof_s:.1f} s; step needs "
                  f"{prof.graph.total_bytes() / 2**30:.2f} GiB")
    rows = []
    for setting, comm, speedup in settings:
        rows += _place_all(name, replace(prof.graph, fwd_us=prof.graph.fwd_us / speedup,
                                         bwd_us=prof.graph.bwd_us / speedup),
                           n_dev, comm, kind, batch, prof_s, setting)
    return rows


def _place_all(name, g, n_dev, comm, kind, batch, prof_s, setting) -> list[dict]:
    cap = int(g.total_bytes() * CAP_FRACTION)
    devices = Devices.uniform(n_dev, cap)
    ex = simulate(g, expert(g, kind, n_dev), comm, n_dev)
    rows = []
    for algo in ALGOS:
        plan = plan_graph(g, devices, comm, algo=algo)
        single = plan.single_device_step_time_s
        best = min(single, ex.makespan_s) if ex.peak_bytes.max() <= cap else single
        rows.append({
            "bench": "place", "setting": setting, "model": name, "algo": algo,
            "devices": n_dev, "batch": batch,
            "nodes_before": plan.nodes_before, "nodes_after": plan.nodes_after,
            "placement_time_s": plan.placement_time_s, "profile_time_s": prof_s,
            "predicted_step_time_s": plan.predicted_step_time_s,
            "single_device_step_time_s": single, "expert_step_time_s": ex.makespan_s,
            "expert_fits": bool(ex.peak_bytes.max() <= cap),
            "gap_vs_best": plan.predicted_step_time_s / best - 1.0,
            "critical_path_s": plan.critical_path_s, "memory_cap_bytes": cap,
            "peak_memory_bytes": plan.peak_memory_bytes, "comm": plan.comm})
    return rows


def bench_large(n: int, n_dev: int, comm, console: Console) -> list[dict]:
    g = layered_dag(n, width=40, rng=np.random.default_rng(0))
    devices = Devices.uniform(n_dev, int(g.total_bytes() * CAP_FRACTION))
    rows = []
    for algo in ALGOS:
        for target in (None, n):  # coarsened as usual; and the raw graph, merging nothing
            t = time.perf_counter()
            if target is None:
                plan = plan_graph(g, devices, comm, algo=algo)
                after, took, step = plan.nodes_after, plan.placement_time_s, \
                    plan.predicted_step_time_s
            else:
                from plinth.place import placer

                p = placer(algo)(g, devices, comm)
                took = time.perf_counter() - t
                after, step = g.n, simulate(g, p.device, comm, n_dev, order=p.order).makespan_s
            rows.append({"bench": "place_large", "setting": "PCIe", "model": f"layered-dag-{n}", "algo": algo,
                         "coarsened": target is None, "nodes_before": g.n, "nodes_after": after,
                         "placement_time_s": took, "predicted_step_time_s": step,
                         "single_device_step_time_s": g.work_us.sum() / 1e6})
    return rows


def real_step(devices: list[str], batch: int = 8, steps: int = 5) -> dict:
    """Measured step time of a placed model against the prediction, on the devices present.
    On a CPU-only machine this is one device (a second "cpu" would not run in parallel)."""
    from plinth.place import apply, place_model

    model, inputs = models.transformer(batch, layers=4, d_model=256, heads=4, seq=128,
                                       vocab=8192)
    model, inputs = model.to(devices[0]), tuple(x.to(devices[0]) for x in inputs)
    plan = place_model(model, inputs, devices=devices, memory_bytes=1 << 40,
                       comm=measure_local())
    placed = apply(model, plan)

    def sync():
        for d in devices:
            if d.startswith("cuda"):
                torch.cuda.synchronize(d)

    times = []
    for _ in range(steps + 1):
        placed.zero_grad(set_to_none=True)
        sync()
        t = time.perf_counter()
        placed(*inputs).float().mean().backward()
        sync()
        times.append(time.perf_counter() - t)
    measured = float(np.median(times[1:]))
    return {"bench": "place_real", "devices": devices, "batch": batch,
            "predicted_step_time_s": plan.predicted_step_time_s, "measured_step_time_s": measured,
            "error": plan.predicted_step_time_s / measured - 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--large", type=int, default=10_000, help="nodes of the random graph (0: skip)")
    ap.add_argument("--gpu-speedup", type=float, default=100.0,
                    help="what-if setting: compute this many times faster, PCIe links")
    ap.add_argument("--real", action="store_true",
                    help="only measure a placed model's real step time against the prediction")
    args = ap.parse_args()
    torch.set_num_threads(2)
    console = Console(width=None if sys.stdout.isatty() else 170)
    if args.real:
        n = torch.cuda.device_count()
        devices = [f"cuda:{i}" for i in range(min(n, args.devices))] if n else ["cpu"]
        row = real_step(devices)
        console.print(f"devices {', '.join(devices)}: predicted "
                      f"{row['predicted_step_time_s'] * 1e3:,.1f} ms, measured "
                      f"{row['measured_step_time_s'] * 1e3:,.1f} ms ({row['error']:+.1%})")
        if args.json_path:
            with open(args.json_path, "w") as f:
                json.dump([row], f, indent=1)
        return
    comm = measure_local()
    console.print(f"comm: {comm.describe()}")
    # Two settings for the same profiled graphs: as measured here (CPU compute, CPU copies),
    # and a what-if with GPU-class compute over PCIe, where transfers matter.
    settings = [("cpu", comm, 1.0)]
    if args.gpu_speedup > 0:
        settings.append((f"gpu-like x{args.gpu_speedup:g}, PCIe", PCIE, args.gpu_speedup))
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        rows += bench_model(name, args.devices, settings, console)
    if args.large:
        rows += bench_large(args.large, args.devices, PCIE, console)
    t = Table(title=f"Baechi placement on {args.devices} devices (CPU-profiled costs)")
    for col in ("setting", "model", "algo", "nodes", "place s", "step ms", "1-dev ms", "expert ms",
                "gap", "peak GiB (max/cap)"):
        t.add_column(col, justify="left" if col in ("setting", "model", "algo") else "right")
    for r in rows:
        ex = r.get("expert_step_time_s")
        t.add_row(r.get("setting", "cpu"),
                  r["model"] + ("" if r.get("coarsened", True) else " (raw)"), r["algo"],
                  f"{r['nodes_before']:,} → {r['nodes_after']:,}", f"{r['placement_time_s']:.3f}",
                  f"{r['predicted_step_time_s'] * 1e3:,.0f}",
                  f"{r['single_device_step_time_s'] * 1e3:,.0f}",
                  "–" if ex is None else f"{ex * 1e3:,.0f}" + ("" if r["expert_fits"] else "*"),
                  "–" if "gap_vs_best" not in r else f"{r['gap_vs_best']:+.1%}",
                  "–" if "peak_memory_bytes" not in r else
                  f"{max(r['peak_memory_bytes']) / 2**30:.2f}/{r['memory_cap_bytes'] / 2**30:.2f}")
    t.caption = f"comm: {comm.describe()}"
    console.print(t)
    console.print("gap: predicted step / min(one device with unlimited memory, expert) - 1; "
                  "* expert split exceeds the memory cap (not counted as a baseline)")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=1)
        console.print(f"results: {args.json_path}")


if __name__ == "__main__":
    main()

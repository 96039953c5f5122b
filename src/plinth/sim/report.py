"""Tables and plots of simulation results. The plots import numpy and matplotlib when they are
drawn, so that `plinth sim --help` imports neither."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    import numpy as np

    from plinth.sim.engine import SimResult

COLUMNS = [  # (key, header, format)
    ("policy", "policy", "{}"),
    ("rounds", "rounds", "{}"),
    ("jobs", "jobs", "{:,}"),
    ("avg_jct_s", "avg JCT (h)", "h"),
    ("p50_jct_s", "p50 JCT (h)", "h"),
    ("p99_jct_s", "p99 JCT (h)", "h"),
    ("avg_queue_s", "avg queue (h)", "h"),
    ("makespan_s", "makespan (h)", "h"),
    ("gpu_utilization", "GPU util", "{:.1%}"),
    ("ftf_rho_median", "FTF ρ p50", "{:.2f}"),
    ("ftf_rho_max", "FTF ρ max", "{:.1f}"),
    ("preemptions", "preempt", "{:,}"),
    ("gpu_alloc_ratio_at_first_failure", "alloc@fail", "{:.1%}"),
    ("sim_wall_s", "wall (s)", "{:.1f}"),
]


def console() -> Console:
    """A console for results: piped output has no terminal width to go by, so it gets one
    wide enough for the results table."""
    import sys

    return Console(width=None if sys.stdout.isatty() else 160)


def table(rows: list[dict], title: str = "") -> Table:
    cols = [c for c in COLUMNS if any(r.get(c[0]) is not None for r in rows)]
    t = Table(title=title or None)
    for key, header, _ in cols:
        t.add_column(header, justify="left" if key == "policy" else "right")
    for r in rows:
        t.add_row(*(_fmt(r.get(key), fmt) for key, _, fmt in cols))
    return t


def _fmt(v: object, fmt: str) -> str:
    if v is None:
        return "-"
    if fmt == "h":
        return f"{float(v) / 3600:,.2f}"  # type: ignore[arg-type]
    return fmt.format(v)


def write_json(rows: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rows, indent=2) + "\n")


def plot(results: list[SimResult], out_dir: str | Path, name: str = "sim") -> list[Path]:
    """Write a JCT CDF and a utilisation-over-time plot; return their paths."""
    import matplotlib
    import numpy as np

    from plinth.sim.metrics import jct_values

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        jct = np.sort(jct_values(r)) / 3600
        if jct.size:
            ax.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    cdf = out / f"{name}_jct_cdf.png"
    fig.tight_layout()
    fig.savefig(cdf, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        t, used = _downsample(r.util_times, r.util_used, 200)
        ax.plot(t / 3600, used / r.cluster.total_gpus, label=r.policy, lw=1.0)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs allocated (fraction, binned mean)")
    ax.set_ylim(0, 1.05)
    ax.set_title("GPU utilisation over time")
    ax.grid(alpha=0.3)
    ax.legend()
    util = out / f"{name}_utilization.png"
    fig.tight_layout()
    fig.savefig(util, dpi=120)
    plt.close(fig)
    return [cdf, util]


def _downsample(t: np.ndarray, v: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """The step function (value v[i] from t[i] on) averaged over equal time bins, so that a
    long replay still plots quickly and an interval that spans bins counts in each of them."""
    import numpy as np

    if t.size < 2 or t[-1] <= t[0]:
        return t, v
    area = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(t))))  # integral up to t[i]
    edges = np.linspace(t[0], t[-1], points + 1)
    at_edges = np.interp(edges, t, area)  # the integral is piecewise linear between events
    return edges[:-1], np.diff(at_edges) / np.diff(edges)

"""Tables, JSON and plots for serving simulations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.table import Table

from plinth.serve.sim import SimResult


def table(results: list[SimResult], title: str) -> Table:
    t = Table(title=title)
    for col in ("policy", "SLO viol.", "lost util.", "p50 s", "p99 s", "dropped", "solver ms"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    best = min(r.slo_violation_rate for r in results)
    for r in results:
        mark = "[bold green]" if r.slo_violation_rate == best else ""
        t.add_row(r.policy, f"{mark}{r.slo_violation_rate:.4f}", f"{r.lost_utility:.3f}",
                  f"{r.p50_latency_s:.3f}", f"{r.p99_latency_s:.3f}", f"{r.dropped:,}",
                  f"{r.solver_ms_mean:.1f}" if r.solver_ms_mean else "-")
    return t


def write_json(results: list[SimResult], path: str | Path, extra: dict | None = None) -> None:
    rows = [dict(r.row(), **(extra or {})) for r in results]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rows, indent=2) + "\n")


def plot(results: list[SimResult], out: str | Path) -> list[Path]:
    """One replica timeline per policy (stacked by job) and SLO satisfaction over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 * len(results)), sharex=True,
                             squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        ax.stackplot(r.tick_times / 60.0, r.replicas.T, linewidth=0)
        ax.set_ylabel("replicas")
        ax.set_title(r.policy, fontsize=9)
    axes[-1, 0].set_xlabel("minute")
    fig.tight_layout()
    paths.append(out / "replicas.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for r in results:
        ax.plot(np.arange(r.satisfaction.shape[0]), 1.0 - r.satisfaction.mean(axis=1),
                label=r.policy, linewidth=0.8)
    ax.set_xlabel("minute")
    ax.set_ylabel("SLO violation rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "slo_violation.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths

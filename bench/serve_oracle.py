"""How far a perfect forecast would take Faro on the 10-job Twitter trace at 32 CPUs.

    python bench/serve_oracle.py [--trace-dir ../shared/data/traces/faro-twitter] [--cpus 32]

Runs faro-fairsum with its Holt forecaster and with an oracle that knows the true counts of the
next 7 minutes, each with the 5-minute planner and with a 1-minute one, next to AIAD (the best
baseline in bench/serve.py). The oracle bounds what any forecaster could give this planner.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from plinth.serve.policies import make_policy
from plinth.serve.policies.faro import Faro
from plinth.serve.sim import SimConfig, simulate
from plinth.serve.traces import CountTrace, load_service_time, load_trace


class Oracle:
    """A 'forecaster' that reads the trace's future: every quantile is the true count."""

    horizon = 7

    def __init__(self, trace: CountTrace) -> None:
        self.counts = trace.counts

    def quantiles(self, history: np.ndarray, qs) -> np.ndarray:
        t = history.shape[1]
        fut = self.counts[t:t + self.horizon].T.astype(float)
        if fut.shape[1] == 0:
            fut = history[:, -1:].astype(float)
        if fut.shape[1] < self.horizon:
            fut = np.pad(fut, ((0, 0), (0, self.horizon - fut.shape[1])), mode="edge")
        return np.repeat(fut[:, :, None], len(qs), axis=2)


def main() -> None:
    here = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-dir", default=str(here.parent / "shared/data/traces/faro-twitter"))
    ap.add_argument("--cpus", type=int, default=32)
    args = ap.parse_args()
    d = Path(args.trace_dir)
    tr = load_trace(str(d / "jobs10_6h.jsonl"))
    cfg = SimConfig(service=load_service_time(str(d / "resnet34_latency_lognorm.yaml")),
                    slo_s=0.72, quota=args.cpus)
    aiad = simulate(tr, make_policy("aiad"), cfg).slo_violation_rate
    t = Table(title=f"faro-fairsum on 10 jobs x 6 h, {args.cpus} CPUs (AIAD: {aiad:.4f})")
    for col in ("forecast", "planner period", "SLO violation rate", "AIAD / Faro"):
        t.add_column(col)
    for period in (300.0, 60.0):
        for name, fc in (("Holt (real)", None), ("oracle (true future)", Oracle(tr))):
            p = Faro(period_s=period) if fc is None else Faro(period_s=period, forecaster=fc)
            v = simulate(tr, p, cfg).slo_violation_rate
            t.add_row(name, f"{period:.0f} s", f"{v:.4f}", f"{aiad / v:.2f}x")
    Console().print(t)


if __name__ == "__main__":
    main()

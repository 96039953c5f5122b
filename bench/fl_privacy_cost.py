"""Accuracy cost of issue 19's privacy fixes on MNIST: the DP example, 100 clients, 30 rounds.

Each configuration is one `plinth fl sim` run of examples/fl/mnist/dp.yaml (DP-FedAvg, adaptive
clip, z = 1) in its own process; the table gives test accuracy at a few rounds, the final ε and
the spread of the number of clients per round:

- ``before``: the code before the fix (pass its source tree with ``--before-src``, e.g. from
  ``git archive <commit> src | tar -x -C /tmp/before``): a fixed-size draw of ⌈0.2·100⌉ = 20
  clients from a seeded generator, seeded server noise, accounted as if Poisson;
- ``sim``: the YAML as it is after the fix in `plinth fl sim`: a seeded Poisson draw (q = 0.2)
  and seeded noise, divided by q·N;
- ``csprng``: what `plinth fl server` does: noise and the Poisson draw from ChaCha20 keyed by
  the OS (``privacy.dp.noise: chacha``).

    .venv/bin/python bench/fl_privacy_cost.py --before-src /tmp/before/src --json /tmp/fl_privacy_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "fl" / "mnist" / "dp.yaml"
CONFIGS = {"before": {}, "sim": {}, "csprng": {"privacy.dp.noise": "chacha"}}


def one(label: str, clients: int, rounds: int, workers: int, out: str) -> None:
    """One run in this process (the code on sys.path), its summary JSON written to `out`."""
    from plinth.fl.app import load_app
    from plinth.fl.results import write_json
    from plinth.fl.sim import run_sim

    dp = load_app(str(APP)).privacy.dp.model_dump()
    dp.update({k.split(".")[-1]: v for k, v in CONFIGS[label].items()})
    result = run_sim(str(APP), clients=clients, rounds=rounds, workers=workers,
                     overrides={"privacy": {"dp": dp}})
    write_json(result, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--before-src", help="src/ folder of the code before the fix")
    ap.add_argument("--only", help="comma-separated labels (default: all that can run)")
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(a.one, a.clients, a.rounds, a.workers, a.out)
        return
    labels = a.only.split(",") if a.only else [k for k in CONFIGS
                                               if k != "before" or a.before_src]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in labels:
            env = dict(os.environ)
            if label == "before":
                if not a.before_src:
                    raise SystemExit("--before-src: needed for the 'before' run")
                env["PYTHONPATH"] = str(Path(a.before_src).resolve())
            out = str(Path(tmp) / f"{label}.json")
            subprocess.run([sys.executable, __file__, "--one", label, "--out", out,
                            "--clients", str(a.clients), "--rounds", str(a.rounds),
                            "--workers", str(a.workers)], env=env, check=True)
            results[label] = json.loads(Path(out).read_text())
    show = [r for r in (5, 10, 20, 30) if r <= a.rounds]
    t = Table(title=f"DP-FedAvg on MNIST, {a.clients} clients, {a.rounds} rounds")
    for col in ("config", *(f"acc @{r}" for r in show), "best", "epsilon", "clients/round",
                "seconds"):
        t.add_column(col, justify="right")
    rows = {}
    for label, res in results.items():
        acc = {r["round"]: r["accuracy"] for r in res["rounds"]}
        sizes = [len(r["clients"]) for r in res["rounds"]]
        rows[label] = {"accuracy": acc, "best": res["best_accuracy"], "epsilon": res["epsilon"],
                       "clients_mean": statistics.mean(sizes),
                       "clients_sd": statistics.pstdev(sizes),
                       "seconds": res["total_seconds"]}
        t.add_row(label, *(f"{acc.get(r, float('nan')):.4f}" for r in show),
                  f"{res['best_accuracy']:.4f}", f"{res['epsilon']:.3f}",
                  f"{rows[label]['clients_mean']:.1f} ± {rows[label]['clients_sd']:.1f}",
                  f"{res['total_seconds']:.0f}")
    Console().print(t)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

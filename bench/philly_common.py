"""Shared by the Philly benchmarks (philly_replay, setaside_check, sim_scaling): where the
trace is by default (read from ../shared/data, never copied), and reading it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plinth.sim.traces import Trace, load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/data/traces/philly/philly.csv"


def add_replay_args(ap: argparse.ArgumentParser, policies: str) -> None:
    """--trace, --cluster, --policies (default `policies`) and --window."""
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--cluster", default="32x8xV100")
    ap.add_argument("--policies", default=policies)
    ap.add_argument("--window", default=None)


def philly(trace: str, window: str | None = None) -> Trace:
    """The Philly trace at `trace` (a part of it with `window`), or exit with one line."""
    if not Path(trace).exists():
        sys.exit(f"{trace}: no such file (pass --trace PATH to the Philly CSV)")
    return load_trace(trace, "philly", window=window)

"""Trace loaders: one module per format, all returning a `Trace` whose jobs are sorted by submit
time (ties in file order), numbered 0..n-1 and re-based so the first job arrives at 0.

    trace = load_trace("philly.csv", "philly", window="0d:14d")
"""

from __future__ import annotations

from collections.abc import Callable

from plinth.core.registry import Registry
from plinth.sim.traces.alibaba import load_alibaba
from plinth.sim.traces.base import Trace
from plinth.sim.traces.csv import load_csv, write_csv
from plinth.sim.traces.philly import load_philly
from plinth.sim.traces.synthetic import synthetic_jobs, synthetic_trace
from plinth.sim.traces.window import apply_window, parse_window

LOADERS: Registry[Callable[[str], Trace]] = Registry("trace format")
LOADERS.add("philly", load_philly)
LOADERS.add("alibaba", load_alibaba)
LOADERS.add("csv", load_csv)


def load_trace(path: str, fmt: str, window: str | tuple[float, float] | None = None) -> Trace:
    """Load `path` in format `fmt` (philly, alibaba, csv), optionally cut to a time window."""
    loader = LOADERS.get(fmt)
    if isinstance(window, str):
        window = parse_window(window)  # a bad window fails before a long load, not after
    trace = loader(str(path))
    return apply_window(trace, window) if window is not None else trace


__all__ = [
    "LOADERS", "Trace", "apply_window", "load_alibaba", "load_csv", "load_philly", "load_trace",
    "parse_window", "synthetic_jobs", "synthetic_trace", "write_csv",
]

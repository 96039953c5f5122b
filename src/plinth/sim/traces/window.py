"""Time windows over a trace: ``--window 0d:14d``, ``3600:86400``, ``2h:``, ``:30m``.

A window keeps the jobs whose submit time (relative to the trace start) lies in [start, end)
and re-bases times so the first kept job arrives at 0. Units are s, m, h, d; no unit = seconds.
"""

from __future__ import annotations

import dataclasses
import math
import re

from plinth.core.errors import SpecError
from plinth.sim.traces.base import Trace

_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_BOUND = re.compile(r"^\s*(?:(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?))?\s*$")
_EXAMPLES = "examples: 0d:14d, 3600:86400, 2h:, :30m"


def _bound(part: str, text: str) -> float | None:
    m = _BOUND.match(part)
    if m is None:
        raise SpecError(f"window {text!r}: cannot read {part.strip()!r}; expected a number with an "
                        f"optional unit s, m, h or d ({_EXAMPLES})")
    if m.group(1) is None:
        return None
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_window(text: str) -> tuple[float, float]:
    """`(start, end)` in seconds; an open end is `math.inf`."""
    if text.count(":") != 1:
        raise SpecError(f"window {text!r}: expected START:END ({_EXAMPLES})")
    first, second = text.split(":")
    start, end = _bound(first, text), _bound(second, text)
    start = 0.0 if start is None else start
    end = math.inf if end is None else end
    if end <= start:
        raise SpecError(f"window {text!r}: the end ({end:g} s) must be after the start "
                        f"({start:g} s)")
    return start, end


def apply_window(trace: Trace, window: tuple[float, float] | str) -> Trace:
    """The jobs of `trace` submitted in [start, end), re-based to 0 and renumbered 0..n-1.
    New Job objects are made, so the input trace is left as it was."""
    start, end = parse_window(window) if isinstance(window, str) else window
    kept = [j for j in trace.jobs if start <= j.submit_time < end]
    if not kept:
        raise SpecError(f"window {start:g}s..{end:g}s selects no jobs from {trace.source} "
                        f"(its submissions span 0..{trace.span:g} s)")
    t0 = kept[0].submit_time
    jobs = [dataclasses.replace(j, id=i, submit_time=j.submit_time - t0)
            for i, j in enumerate(kept)]
    note = f"window [{start:g}, {end:g}) s kept {len(jobs)} of {len(trace.jobs)} jobs"
    return dataclasses.replace(trace, jobs=jobs, notes=(*trace.notes, note))

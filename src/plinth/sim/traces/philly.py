"""Microsoft Philly (2017) per-job trace: ``timestamp,duration,num_gpus,gpu_time,cluster``.

- `timestamp` is the submit time (``2017-10-09 07:01:55``, or plain seconds); rows are not
  sorted in the file, so the shared `build_trace` sorts them.
- `duration` is the run time in seconds and must be > 0.
- A job of N GPUs becomes N one-GPU workers, `Request(gpus=1, workers=N)`: Philly does not say
  how jobs were split across servers, and placement consolidates the gang as far as it can.
- `cluster` (Philly's virtual cluster) is the tenant; `gpu_time` is redundant and ignored.
"""

from __future__ import annotations

import math
from datetime import datetime

from plinth.core.errors import TraceError
from plinth.core.resources import Request
from plinth.sim.traces.base import CsvRows, RawJob, Trace, build_trace, parse_float, parse_int

REQUIRED = ("timestamp", "duration", "num_gpus")
OPTIONAL = ("gpu_time", "cluster")
_EPOCH = datetime(1970, 1, 1)


def _seconds(text: str, path: str, line: int) -> float:
    """Seconds of a timestamp on a common clock; only differences matter after re-basing."""
    try:
        t = datetime.fromisoformat(text)
        # Naive stamps (Philly's) are taken as UTC; aware ones convert, so mixes stay ordered.
        return t.timestamp() if t.tzinfo else (t - _EPOCH).total_seconds()
    except ValueError:
        pass
    try:
        value = float(text)  # already seconds, as synthetic or converted traces write them
    except ValueError:
        value = math.nan
    if math.isfinite(value):
        return value
    raise TraceError(path, line, f"timestamp: expected a time like 2017-10-09 07:01:55, "
                                 f"got {text!r}")


def load_philly(path: str) -> Trace:
    rows = CsvRows(path, REQUIRED, OPTIONAL)
    c_ts, c_dur, c_gpus, c_vc = (rows.col[c] for c in ("timestamp", "duration", "num_gpus",
                                                        "cluster"))
    requests: dict[int, Request] = {}  # Requests are frozen: share one per gang size
    raw: list[RawJob] = []
    for line, row in rows:
        submit = _seconds(row[c_ts].strip(), path, line)
        duration = parse_float(row[c_dur].strip(), path, line, "duration", positive=True)
        gpus = parse_int(row[c_gpus].strip(), path, line, "num_gpus", minimum=1)
        req = requests.get(gpus)
        if req is None:
            req = requests[gpus] = Request(gpus=1, workers=gpus)
        tenant = CsvRows.get(row, c_vc) or "default"
        raw.append(RawJob(submit, duration, req, "", tenant, 0, line))
    return build_trace(raw, path, "philly", rows.last_line)

"""Loaders for the serving traces: per-minute request counts and service-time fits.

Every loader checks its input once, at the boundary, and a bad line raises a `TraceError` that
names the file and the line. The loaders accept the formats as they are published:

- Faro's Twitter trace: JSON lines `{"ts": minute, "counts": {"job": {"model": n}}}`, or the same
  records as one JSON array (the upstream `input.json`);
- a service-time fit in YAML: `type: lognorm` with `params: {shape, loc, scale}` (scipy's
  parameterisation), or `type: constant` with `params: {value}`;
- the Azure LLM inference trace (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`): one job, binned per
  minute for the forecasters, with its exact request times kept for replay.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from plinth.core.errors import SpecError, TraceError
from plinth.core.spec import read_yaml


@dataclass(frozen=True, slots=True)
class CountTrace:
    """Requests per minute: `counts[minute, job]`. A trace with request timestamps also keeps
    them (`arrivals[job]`, seconds from the start, sorted), and the simulator replays them as they
    are instead of spreading each minute's count at random."""

    path: str
    jobs: tuple[str, ...]
    counts: np.ndarray  # int64, shape (minutes, jobs)
    arrivals: tuple[np.ndarray, ...] | None = None

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[0])

    def window(self, start_min: int, end_min: int | None) -> CountTrace:
        """Minutes [start, end) of the trace; an empty window is an error."""
        sub = self.counts[start_min:end_min]
        if sub.shape[0] == 0:
            raise SpecError(f"--minutes: window {start_min}:{end_min} of {self.path} is empty "
                            f"(the trace has {self.minutes} minutes)")
        arrivals = None
        if self.arrivals is not None:
            t0, t1 = start_min * 60.0, (start_min + sub.shape[0]) * 60.0
            arrivals = tuple(a[(a >= t0) & (a < t1)] - t0 for a in self.arrivals)
        return CountTrace(self.path, self.jobs, sub, arrivals)

    def first_jobs(self, n: int) -> CountTrace:
        if not 1 <= n <= len(self.jobs):
            raise SpecError(f"--jobs: {n} is not between 1 and {len(self.jobs)}")
        arrivals = None if self.arrivals is None else self.arrivals[:n]
        return CountTrace(self.path, self.jobs[:n], self.counts[:, :n], arrivals)


@dataclass(frozen=True, slots=True)
class ServiceTime:
    """A per-request service-time distribution (seconds), sampled with a passed-in rng."""

    kind: str  # "lognorm" | "constant"
    shape: float = 0.0
    loc: float = 0.0
    scale: float = 0.0

    @property
    def mean(self) -> float:
        if self.kind == "constant":
            return self.loc
        return self.loc + self.scale * math.exp(self.shape**2 / 2)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "constant":
            return np.full(n, self.loc)
        return self.loc + self.scale * np.exp(self.shape * rng.standard_normal(n))

    @staticmethod
    def constant(value: float) -> ServiceTime:
        return ServiceTime("constant", loc=float(value))


def _count(path: str, line: int, job: str, value: object) -> int:
    """A job's count is an int, or a dict of per-model ints that are summed."""
    parts = value.values() if isinstance(value, dict) else [value]
    total = 0
    for v in parts:
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or v != int(v)):
            raise TraceError(path, line, f"job {job!r}: count {v!r} is not a whole number")
        if v < 0:
            raise TraceError(path, line, f"job {job!r}: negative count {v}")
        total += int(v)
    return total


def load_counts(path: str | Path) -> CountTrace:
    """Load a Faro-style per-minute count trace. Minutes must be 0, 1, 2, … with no gap, and every
    line must list exactly the jobs of the first line."""
    p = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TraceError(p, 0, f"cannot read: {e.strerror}") from None
    if text.lstrip().startswith("["):
        try:
            records = [(i + 1, r) for i, r in enumerate(json.loads(text))]
        except json.JSONDecodeError as e:
            raise TraceError(p, e.lineno, f"bad JSON: {e.msg}") from None
    else:
        records = []
        for i, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                records.append((i, json.loads(raw)))
            except json.JSONDecodeError as e:
                raise TraceError(p, i, f"bad JSON: {e.msg}") from None
    if not records:
        raise TraceError(p, 1, "the trace is empty")
    jobs: tuple[str, ...] = ()
    rows: list[list[int]] = []
    for n, (line, rec) in enumerate(records):
        if not isinstance(rec, dict) or "ts" not in rec or "counts" not in rec:
            raise TraceError(p, line, "expected an object with 'ts' and 'counts'")
        ts, counts = rec["ts"], rec["counts"]
        if not isinstance(counts, dict) or not counts:
            raise TraceError(p, line, "'counts' must be a non-empty object of job: count")
        if n == 0:
            jobs = tuple(counts)
            if not isinstance(ts, int):
                raise TraceError(p, line, f"'ts' {ts!r} is not an integer minute")
            first_ts = ts
        expected = first_ts + n
        if ts != expected:
            raise TraceError(p, line, f"gap in minutes: ts {ts!r} where {expected} was expected")
        unknown = [j for j in counts if j not in jobs]
        if unknown:
            raise TraceError(p, line, f"unknown job {unknown[0]!r} (not in the first line)")
        missing = [j for j in jobs if j not in counts]
        if missing:
            raise TraceError(p, line, f"job {missing[0]!r} is missing")
        rows.append([_count(p, line, j, counts[j]) for j in jobs])
    return CountTrace(p, jobs, np.asarray(rows, dtype=np.int64))


def load_azure_llm(path: str | Path, job: str = "azure-llm") -> CountTrace:
    """Bin the Azure LLM inference trace's request timestamps per minute into one job."""
    p = str(path)
    stamps: list[float] = []
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header or header[0].strip().upper() != "TIMESTAMP":
                raise TraceError(p, 1, "expected a header starting with TIMESTAMP")
            for i, row in enumerate(reader, 2):
                if not row:
                    continue
                try:
                    stamps.append(datetime.fromisoformat(row[0].strip()[:26]).timestamp())
                except ValueError:
                    raise TraceError(p, i, f"TIMESTAMP {row[0]!r} is not a date-time") from None
    except OSError as e:
        raise TraceError(p, 0, f"cannot read: {e.strerror}") from None
    if not stamps:
        raise TraceError(p, 2, "the trace has no requests")
    t = np.asarray(stamps)
    if np.any(np.diff(t) < 0):
        bad = int(np.argmax(np.diff(t) < 0)) + 3
        raise TraceError(p, bad, "timestamps go backwards")
    rel = t - t[0]
    counts = np.bincount((rel // 60).astype(np.int64)).astype(np.int64)[:, None]
    return CountTrace(p, (job,), counts, (rel,))


def load_trace(path: str | Path) -> CountTrace:
    """Pick the loader by file name: `.csv` is the Azure LLM trace, anything else Faro's JSON."""
    return load_azure_llm(path) if str(path).lower().endswith(".csv") else load_counts(path)


# Named fits, for comparing like with like. "faro-10job" is the lognormal that Faro's 10-job
# Twitter experiment configures (`experiments/top9_twitter_…/job_latency_specs.yaml` in
# beomyeol/faro @ b595c4ad, mean 154 ms); the project's default fit is the file
# `faro-twitter/resnet34_latency_lognorm.yaml` (from the same repository's 100-job experiment,
# mean 165 ms).
SERVICE_FITS = {
    "faro-10job": ServiceTime("lognorm", shape=0.42247119, loc=0.07930158, scale=0.06858079),
}


def load_service_time(path: str | Path) -> ServiceTime:
    """Load a service-time fit: a YAML file, or one of the names in `SERVICE_FITS`. Errors name
    the file and the field."""
    p = str(path)
    if p in SERVICE_FITS:
        return SERVICE_FITS[p]
    doc = read_yaml(path, "service-time fit")
    if not isinstance(doc, dict) or "type" not in doc:
        raise SpecError(f"{p}: field 'type' is required (lognorm or constant)")
    params = doc.get("params") or {}
    if not isinstance(params, dict):
        raise SpecError(f"{p}: field 'params' must be a mapping")

    def num(name: str, positive: bool = True) -> float:
        v = params.get(name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise SpecError(f"{p}: field 'params.{name}' must be a number, got {v!r}")
        if v < 0 or (positive and v == 0):
            raise SpecError(f"{p}: field 'params.{name}' must be {'> 0' if positive else '>= 0'}, "
                            f"got {v}")
        return float(v)

    kind = doc["type"]
    if kind == "lognorm":
        return ServiceTime("lognorm", shape=num("shape"), loc=num("loc", False), scale=num("scale"))
    if kind == "constant":
        return ServiceTime.constant(num("value"))
    raise SpecError(f"{p}: field 'type' must be lognorm or constant, got {kind!r}")

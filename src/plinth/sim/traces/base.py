"""What every trace loader shares: the `Trace` result, a header-checked CSV row reader, field
parsers whose errors name the file, line, column and value, and the final sort-and-renumber step.

Loaders collect plain tuples first and build `Job`s only once every row has parsed, so a bad row
raises before anything is returned (nothing is half-loaded), and parsing stays cheap (no per-row
pydantic): the real Philly trace has 82k rows.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from plinth.core.errors import SpecError, TraceError
from plinth.core.gpus import gpu_model
from plinth.core.resources import Request
from plinth.core.workload import Job


@dataclass(frozen=True, slots=True)
class Trace:
    """Jobs sorted by (submit time, row order), ids 0..n-1, the first submitted at time 0."""

    jobs: list[Job]
    source: str  # the path it was read from, or a description
    format: str  # "philly", "alibaba", "csv", "synthetic"
    notes: tuple[str, ...] = field(default=())  # what the loader adjusted, for the user to see

    @property
    def span(self) -> float:
        """Time from the first to the last submission."""
        return self.jobs[-1].submit_time if self.jobs else 0.0


class RawJob(NamedTuple):
    """One parsed row before sorting; `submit` is absolute in the trace's own clock."""

    submit: float
    duration: float
    request: Request
    name: str = ""
    tenant: str = "default"
    priority: int = 0
    line: int = 0  # line in the file, so later errors (an unplaceable job) can point at it
    job_type: str = ""


class CsvRows:
    """Iterate `(line, row)` over a CSV with a header; `col[name]` is the column's index.

    Required columns must be in the header; optional ones map to -1 when absent, and `get`
    returns "" for them, so loaders treat "absent" and "empty" alike. Rows must have every
    header field, except with `short_rows`, where hand-written rows may stop once the required
    columns are given (the rest read as empty).
    """

    def __init__(self, path: str, required: Sequence[str], optional: Sequence[str] = (),
                 *, short_rows: bool = False) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise TraceError(path, 0, f"cannot read trace: {e.strerror}") from None
        # Decoding the whole file at once (traces here are a few MB) lets a bad byte be reported
        # at its line; utf-8-sig drops the byte-order mark that spreadsheet exports add.
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TraceError(path, data.count(b"\n", 0, e.start) + 1, "not UTF-8 text") from None
        self._file = io.StringIO(text, newline="")
        self._reader = csv.reader(self._file)
        header = [h.strip() for h in self._next_or_fail([])]
        if not header:
            raise TraceError(path, 1, f"empty file; expected a header with {','.join(required)}")
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(path, 1, f"missing required column {missing[0]!r} "
                                      f"(header has: {','.join(header)})")
        self.col = {c: header.index(c) if c in header else -1 for c in (*required, *optional)}
        self.width = 1 + max(self.col[c] for c in required) if short_rows else len(header)

    def _next_or_fail(self, default: list[str]) -> list[str]:
        """The next record; broken quoting or a NUL byte becomes a TraceError."""
        try:
            return next(self._reader, default)
        except csv.Error as e:
            raise TraceError(self.path, self._reader.line_num, f"bad CSV: {e}") from None

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        end: list[str] = []
        with self._file:
            while (row := self._next_or_fail(end)) is not end:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank lines carry no job
                line = self._reader.line_num
                if len(row) < self.width:
                    raise TraceError(self.path, line,
                                     f"expected {self.width} fields, got {len(row)}")
                yield line, row

    @property
    def last_line(self) -> int:
        return self._reader.line_num

    @staticmethod
    def get(row: list[str], index: int) -> str:
        return row[index].strip() if 0 <= index < len(row) else ""


def _bad(path: str, line: int, column: str, what: str, text: str) -> TraceError:
    return TraceError(path, line, f"{column}: expected {what}, got {text!r}")


def parse_float(text: str, path: str, line: int, column: str, *, positive: bool = False) -> float:
    """A finite float; with `positive`, also > 0."""
    what = "a positive number" if positive else "a number"
    try:
        value = float(text)
    except ValueError:
        raise _bad(path, line, column, what, text) from None
    if not math.isfinite(value) or (positive and value <= 0):
        raise _bad(path, line, column, what, text)
    return value


def parse_int(text: str, path: str, line: int, column: str, *, minimum: int = 0) -> int:
    """An integer >= `minimum`. Integral floats such as ``4.0`` pass: exports often write them."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise _bad(path, line, column, what, text) from None
        if not f.is_integer():
            raise _bad(path, line, column, what, text) from None
        value = int(f)
    if value < minimum:
        raise _bad(path, line, column, what, text)
    return value


def build_trace(raw: list[RawJob], path: str, fmt: str, last_line: int,
                notes: tuple[str, ...] = ()) -> Trace:
    """Sort by submit time (stable, so ties keep file order), re-base to 0, number 0..n-1."""
    if not raw:
        raise TraceError(path, max(last_line, 1), "trace has no jobs")
    raw.sort(key=itemgetter(0))  # list.sort is stable: equal submits stay in row order
    t0 = raw[0].submit
    jobs = [Job(id=i, submit_time=r.submit - t0, duration=r.duration, request=r.request,
                name=r.name, tenant=r.tenant, priority=r.priority, source_line=r.line,
                job_type=r.job_type)
            for i, r in enumerate(raw)]
    return Trace(jobs=jobs, source=path, format=fmt, notes=notes)


def parse_models(text: str, path: str, line: int, column: str) -> tuple[str, ...]:
    """GPU models from a `V100M16|V100M32` cell; empty (or pandas' `nan`) means any model."""
    if text in ("", "nan", "NaN"):
        return ()
    try:
        return tuple(gpu_model(m.strip()).name for m in text.split("|") if m.strip())
    except SpecError as e:
        raise TraceError(path, line, f"{column}: {e}") from None

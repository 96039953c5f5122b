"""Per-(job type, GPU model) training speed relative to a reference GPU (a V100), for
heterogeneity-aware scheduling (Gavel, Themis) and for the simulator's progress rates.

`Throughputs` is that matrix. The built-in one (`DEFAULT_THROUGHPUTS`, from `THROUGHPUT`) holds
rough relative throughputs in the spirit of Gavel's measurements (Narayanan et al., OSDI'20, on
V100, P100 and K80): compute-bound CNNs gain most from newer GPUs, RL and recommendation models
least. `Throughputs.load(path)` reads a measured one, so that a heterogeneous result can be
compared with another simulator's on the same numbers:

- Gavel's JSON (`scheduler/simulation_throughputs.json` in stanford-futuredata/gavel): worker type
  -> job type -> {"null": throughput, "<co-located job>": [...]}. Job types are written
  ``('ResNet-18 (batch size 16)', 1)``: a name and a scale factor (GPUs). The job type here is the
  name; its row comes from its smallest scale factor (1 where measured), because a speed here is
  per GPU and a gang's own communication is the placement's locality factor. Co-location pairs
  and the ``*_unconsolidated`` worker types are not used. A plain number instead of the
  {"null": ...} object is accepted too.
- A CSV: a header ``job_type,<model>,<model>,...`` and one row per job type; an empty cell means
  "not measured".

Either way the numbers are throughputs in any unit (steps/s, samples/s) and each job type's row
is divided by its value on the reference model (V100), because a trace's durations are run times
on that model. A model missing from a row, or a job type missing from the matrix, falls back to
the catalog's relative speed (`plinth.core.gpus`). Bad input is a one-line `SpecError` naming the
file, the line or key, and the value.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plinth.core.errors import SpecError
from plinth.core.gpus import gpu_model
from plinth.core.workload import Job

REFERENCE_MODEL = "V100"

THROUGHPUT: dict[str, dict[str, float]] = {
    "resnet18": {"V100": 1.0, "P100": 0.67, "K80": 0.25, "T4": 0.45, "A100": 2.0},
    "resnet50": {"V100": 1.0, "P100": 0.42, "K80": 0.11, "T4": 0.36, "A100": 2.4},
    "transformer": {"V100": 1.0, "P100": 0.45, "K80": 0.13, "T4": 0.33, "A100": 2.6},
    "lm": {"V100": 1.0, "P100": 0.70, "K80": 0.30, "T4": 0.50, "A100": 1.6},
    "recommendation": {"V100": 1.0, "P100": 0.80, "K80": 0.50, "T4": 0.70, "A100": 1.3},
    "a3c": {"V100": 1.0, "P100": 0.85, "K80": 0.60, "T4": 0.80, "A100": 1.1},
    "cyclegan": {"V100": 1.0, "P100": 0.50, "K80": 0.16, "T4": 0.40, "A100": 2.2},
}

JOB_TYPES: tuple[str, ...] = tuple(THROUGHPUT)

# A job type whose run time does not depend on the GPU model (observed pod lifetimes, services).
FIXED_SPEED = "fixed"

_UNCONSOLIDATED = "_unconsolidated"


@dataclass(frozen=True, slots=True, eq=False)
class Throughputs:
    """The (job type x GPU model) matrix of speeds relative to `reference` (NaN: not measured).

    Lookups are by name; `speeds(job_type, models)` returns a cached row for hot loops."""

    types: tuple[str, ...]
    models: tuple[str, ...]
    matrix: np.ndarray  # (len(types), len(models))
    reference: str = REFERENCE_MODEL
    source: str = "built-in"
    _type_index: dict[str, int] = field(default_factory=dict, repr=False)
    _model_index: dict[str, int] = field(default_factory=dict, repr=False)
    _rows: dict[tuple, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.matrix.shape != (len(self.types), len(self.models)):
            raise ValueError(f"throughputs: matrix shape {self.matrix.shape} does not match "
                             f"{len(self.types)} types x {len(self.models)} models")
        self._type_index.update({t: i for i, t in enumerate(self.types)})
        self._model_index.update({m: i for i, m in enumerate(self.models)})
        self.matrix.setflags(write=False)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_table(cls, table: Mapping[str, Mapping[str, float]], *,
                   reference: str = REFERENCE_MODEL, source: str = "table") -> Throughputs:
        """From {job type: {model: relative speed}}, taken as already relative."""
        types = tuple(table)
        models = tuple(dict.fromkeys(m for row in table.values() for m in row))
        matrix = np.full((len(types), len(models)), np.nan)
        for i, t in enumerate(types):
            for m, v in table[t].items():
                matrix[i, models.index(m)] = v
        return cls(types, models, matrix, reference, source)

    @classmethod
    def load(cls, path: str | Path, *, reference: str = REFERENCE_MODEL) -> Throughputs:
        """Read Gavel's throughput JSON or a `job_type,<model>,...` CSV (by content: a JSON
        file starts with ``{``) and normalise each job type against `reference`."""
        path = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
        except OSError as e:
            raise SpecError(f"{path}: cannot read throughputs: {e.strerror}") from None
        except UnicodeDecodeError:
            raise SpecError(f"{path}: not UTF-8 text") from None
        ref = gpu_model(reference).name
        raw = _read_json(path, text) if text.lstrip().startswith("{") else _read_csv(path, text)
        return _normalise(raw, ref, path)

    # -- lookups ----------------------------------------------------------------------------
    def speed(self, job_type: str, model: str | None) -> float:
        """Progress per second on one GPU of `model`, relative to the reference model."""
        if model is None or job_type == FIXED_SPEED:
            return 1.0
        i, j = self._type_index.get(job_type), self._model_index.get(model)
        if i is not None and j is not None:
            v = self.matrix[i, j]
            if v == v:  # not NaN: measured
                return float(v)
        return gpu_model(model).speed / gpu_model(self.reference).speed

    def speeds(self, job_type: str, models: tuple[str, ...]) -> np.ndarray:
        """`speed(job_type, m)` for each of `models`, as a read-only array (cached)."""
        key = (job_type, models)
        row = self._rows.get(key)
        if row is None:
            row = np.array([self.speed(job_type, m) for m in models], dtype=float)
            row.setflags(write=False)
            self._rows[key] = row
        return row

    def job_type_for(self, job_id: int) -> str:
        """A deterministic type for jobs that carry none (Philly): spread evenly by id."""
        return self.types[(job_id * 2654435761) % len(self.types)]

    def type_of(self, job: Job) -> str:
        """The job's own type, or the one `job_type_for` assigns it."""
        return job.job_type or self.job_type_for(job.id)

    def unknown_types(self, jobs: list[Job]) -> dict[str, Job]:
        """Job types named by `jobs` that this matrix does not hold (first job of each)."""
        out: dict[str, Job] = {}
        for j in jobs:
            t = j.job_type
            if t and t != FIXED_SPEED and t not in self._type_index and t not in out:
                out[t] = j
        return out

    def describe(self) -> str:
        return f"{self.source} ({len(self.types)} job types x {', '.join(self.models)})"


DEFAULT_THROUGHPUTS = Throughputs.from_table(THROUGHPUT, source="built-in")


# -- readers: {job type: {model: (throughput, where)}}, `where` naming the cell for errors ------

_Raw = dict[str, dict[str, tuple[float, str]]]


def _number(value: object, at: str, where: str) -> float:
    """`at` is the file (JSON) or file:line (CSV), `where` the key or cell."""
    x = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            pass
    if not math.isfinite(x) or x <= 0:
        raise SpecError(f"{at}: {where}: expected a positive throughput, got {value!r}")
    return x


def _model(name: str, at: str, where: str) -> str:
    try:
        return gpu_model(name.strip()).name
    except SpecError as e:
        raise SpecError(f"{at}: {where}: {e}") from None


def _read_json(path: str, text: str) -> _Raw:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    # (name, scale) -> model -> (value, where); the smallest scale per name is kept below.
    cells: dict[tuple[str, int], dict[str, tuple[object, str]]] = {}
    for worker, jobs in data.items():
        if worker.endswith(_UNCONSOLIDATED):
            continue  # the same GPUs with a gang spread over servers: not a GPU model
        model = _model(worker, path, f"worker type {worker!r}")
        if not isinstance(jobs, dict):
            raise SpecError(f"{path}: {worker}: expected an object of job types, got "
                            f"{type(jobs).__name__}")
        for key, entry in jobs.items():
            name, scale = _job_key(key, path, worker)
            where = f"{worker} -> {key}"
            if isinstance(entry, dict):
                if "null" not in entry:
                    raise SpecError(f'{path}: {where}: no "null" entry (its throughput when '
                                    "running alone)")
                entry, where = entry["null"], where + " -> null"
            cells.setdefault((name, scale), {})[model] = (entry, where)
    scales: dict[str, int] = {}
    for name, scale in cells:
        scales[name] = min(scale, scales.get(name, scale))
    # Only the entries used are checked: Gavel's file has zeros at larger scales (a gang that
    # does not fit a K80's memory), which are never read here.
    return {name: {m: (_number(v, path, where), where)
                   for m, (v, where) in cells[(name, scale)].items()}
            for name, scale in scales.items()}


def _job_key(key: str, path: str, worker: str) -> tuple[str, int]:
    """Gavel writes job types as a Python tuple literal, ``('A3C', 1)``; a plain name is
    taken as scale factor 1."""
    if not key.startswith("("):
        return key.strip(), 1
    try:
        value = ast.literal_eval(key)
    except (ValueError, SyntaxError):
        value = None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and value[1] >= 1):
        raise SpecError(f"{path}: {worker} -> {key}: expected a job type like "
                        f"\"('ResNet-18 (batch size 16)', 1)\"")
    return value[0].strip(), value[1]


def _read_csv(path: str, text: str) -> _Raw:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as e:
        raise SpecError(f"{path}:1: bad CSV: {e}") from None
    if len(header) < 2 or header[0] != "job_type":
        raise SpecError(f"{path}:1: expected a header job_type,<GPU model>,..., got "
                        f"{','.join(header)!r}")
    models = [_model(h, f"{path}:1", f"column {h!r}") for h in header[1:]]
    if len(set(models)) != len(models):
        raise SpecError(f"{path}:1: a GPU model appears twice in {','.join(header)!r}")
    out: _Raw = {}
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise SpecError(f"{path}:{line}: expected {len(header)} fields, got {len(row)}")
            name = row[0].strip()
            if not name:
                raise SpecError(f"{path}:{line}: job_type: empty")
            if name in out:
                raise SpecError(f"{path}:{line}: job_type {name!r} appears twice")
            out[name] = {}
            for m, h, cell in zip(models, header[1:], row[1:]):
                if cell.strip():
                    where = f"{name},{h}"
                    out[name][m] = (_number(cell.strip(), f"{path}:{line}", where), where)
    except csv.Error as e:
        raise SpecError(f"{path}:{reader.line_num}: bad CSV: {e}") from None
    if not out:
        raise SpecError(f"{path}: no job types (only a header)")
    return out


def _normalise(raw: _Raw, reference: str, path: str) -> Throughputs:
    """Divide each job type's row by its value on the reference model."""
    if not raw:
        raise SpecError(f"{path}: no job types")
    types = tuple(raw)
    models = tuple(dict.fromkeys(m for row in raw.values() for m in row))
    matrix = np.full((len(types), len(models)), np.nan)
    for i, t in enumerate(types):
        row = raw[t]
        if reference not in row:
            raise SpecError(f"{path}: job type {t!r} has no {reference} throughput to "
                            f"normalise against (durations are {reference} run times)")
        ref = row[reference][0]
        for m, (v, _) in row.items():
            matrix[i, models.index(m)] = v / ref
    return Throughputs(types, models, matrix, reference, path)


__all__ = ["DEFAULT_THROUGHPUTS", "FIXED_SPEED", "JOB_TYPES", "REFERENCE_MODEL", "THROUGHPUT",
           "Throughputs"]

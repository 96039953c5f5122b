"""Plinth's own generic CSV trace, for hand-written and generated workloads.

Header required. Columns ``job_id,submit_time,duration,num_gpus`` are required; ``tenant``,
``gpu_milli``, ``gpu_model``, ``gpu_memory_mib`` and ``job_type`` are optional (absent from the
header, empty, or left off the end of a row = default).

- `submit_time` and `duration` are seconds; duration > 0. `job_id` becomes the job's name
  (ids are renumbered in submit order).
- `num_gpus` N >= 1 is a gang of N one-GPU workers, `Request(gpus=1, workers=N)`, as for Philly.
- `gpu_milli` 1..999 with `num_gpus` 1 is a fractional share; `gpu_memory_mib` is its GPU
  memory. `gpu_milli` 1000 (or empty) means whole GPUs.
- `gpu_model` names the allowed models, ``|``-separated (``V100|A100``); empty = any.
- `job_type` names the job's row in the throughput matrix (`plinth.core.throughput`), e.g.
  ``resnet50`` or, with Gavel's measurements loaded, ``ResNet-50 (batch size 64)``; it sets the
  job's speed on each GPU model, so a heterogeneous replay can be compared with another
  simulator's. Empty = a type assigned by job id from the matrix's types.

`write_csv(jobs, path)` writes this format, so generated workloads round-trip through a file.
"""

from __future__ import annotations

import csv as _csv
from collections.abc import Iterable

from plinth.core.errors import SpecError, TraceError
from plinth.core.resources import MILLI, Request
from plinth.core.workload import Job
from plinth.sim.traces.base import (
    CsvRows,
    RawJob,
    Trace,
    build_trace,
    parse_float,
    parse_int,
    parse_models,
)

REQUIRED = ("job_id", "submit_time", "duration", "num_gpus")
OPTIONAL = ("tenant", "gpu_milli", "gpu_model", "gpu_memory_mib", "job_type")
COLUMNS = REQUIRED + OPTIONAL


def load_csv(path: str) -> Trace:
    rows = CsvRows(path, REQUIRED, OPTIONAL, short_rows=True)
    col, get = rows.col, CsvRows.get
    requests: dict[tuple, Request] = {}
    raw: list[RawJob] = []
    for line, row in rows:
        name = get(row, col["job_id"])
        submit = parse_float(get(row, col["submit_time"]), path, line, "submit_time")
        duration = parse_float(get(row, col["duration"]), path, line, "duration", positive=True)
        gpus = parse_int(get(row, col["num_gpus"]), path, line, "num_gpus", minimum=1)
        milli_text = get(row, col["gpu_milli"])
        milli = parse_int(milli_text, path, line, "gpu_milli", minimum=1) if milli_text else MILLI
        if milli > MILLI:
            raise TraceError(path, line, f"gpu_milli: expected 1..1000, got {milli_text!r}")
        if milli < MILLI and gpus != 1:
            raise TraceError(path, line, f"gpu_milli: a fraction ({milli_text}) needs num_gpus "
                                         f"1, got {gpus}")
        mem_text = get(row, col["gpu_memory_mib"])
        mem = parse_int(mem_text, path, line, "gpu_memory_mib") if mem_text else 0
        models = parse_models(get(row, col["gpu_model"]), path, line, "gpu_model")
        shape = (gpus, milli, mem, models)
        req = requests.get(shape)
        if req is None:
            if milli < MILLI:
                req = Request(gpu_milli=milli, gpu_memory_mib=mem, gpu_models=models)
            else:
                req = Request(gpus=1, workers=gpus, gpu_memory_mib=mem, gpu_models=models)
            requests[shape] = req
        raw.append(RawJob(submit, duration, req, name, get(row, col["tenant"]) or "default",
                          0, line, get(row, col["job_type"])))
    return build_trace(raw, path, "csv", rows.last_line)


def _num(x: float) -> str:
    # repr round-trips a float exactly; integral values read better without ".0"
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def write_csv(jobs: Iterable[Job], path: str) -> None:
    """Write `jobs` in the generic format. A job that the format cannot express (a fractional
    gang, or whole GPUs not as one-GPU workers) raises SpecError naming it."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = _csv.writer(f)
        w.writerow(COLUMNS)
        for j in jobs:
            r = j.request
            if r.fractional:
                if r.workers != 1:
                    raise SpecError(f"job {j.id}: a fractional gang ({r.workers} workers) "
                                    f"cannot be written as a CSV trace row")
                num, milli = 1, str(r.gpu_milli)
            elif r.gpus == 1:
                num, milli = r.workers, ""
            else:
                raise SpecError(f"job {j.id}: request {r.gpus} GPUs x {r.workers} workers is not "
                                f"expressible; the CSV format means num_gpus one-GPU workers")
            w.writerow([j.name or str(j.id), _num(j.submit_time), _num(j.duration), num,
                        j.tenant, milli, "|".join(r.gpu_models),
                        r.gpu_memory_mib or "", j.job_type])

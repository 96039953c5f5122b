"""Alibaba GPU cluster trace 2023 (the `openb` pod lists from the FGD paper, ATC'23):
``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``.

- submit = `creation_time`. duration = `deletion_time - scheduled_time`, or `deletion_time -
  creation_time` for a pod never scheduled (`Pending` rows leave `scheduled_time` empty).
- A duration <= 0 (a pod deleted the second it was made) is clamped to 1 s rather than dropped,
  so every pod in the file still arrives; the count is reported in `Trace.notes`.
- `num_gpu` 0: a CPU-only pod. `num_gpu` 1 with `gpu_milli` below 1000: a fractional share.
  Otherwise `num_gpu` whole GPUs on one node, `Request(gpus=num_gpu, workers=1)` (a pod is never
  split across nodes).
- `gpu_spec` (``V100M16|V100M32``; empty or ``nan`` = any) becomes the allowed models.
- `qos` sets the priority: latency-sensitive and guaranteed pods above burstable above
  best-effort. The pod name is kept as the job name. There are no tenants: all are "default".

The `multigpu*` variants of the pod list carry no time columns and so cannot be replayed; the
loader says which column is missing. The node lists load with `alibaba_node_list` (re-exported
here from `plinth.core.spec`, where `load_cluster` uses it).
"""

from __future__ import annotations

from plinth.core.errors import TraceError
from plinth.core.resources import MILLI, Request
from plinth.core.spec import alibaba_node_list
from plinth.core.throughput import FIXED_SPEED
from plinth.sim.traces.base import (
    CsvRows,
    RawJob,
    Trace,
    build_trace,
    parse_float,
    parse_int,
    parse_models,
)

__all__ = ["QOS_PRIORITY", "alibaba_node_list", "load_alibaba"]

REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time",
            "deletion_time")
OPTIONAL = ("gpu_spec", "qos", "pod_phase", "scheduled_time")
QOS_PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0, "": 0}
MIN_DURATION = 1.0


def load_alibaba(path: str) -> Trace:
    rows = CsvRows(path, REQUIRED, OPTIONAL)
    col, get = rows.col, CsvRows.get
    requests: dict[tuple, Request] = {}  # thousands of pods share a few dozen shapes
    raw: list[RawJob] = []
    clamped = 0
    for line, row in rows:
        cpu = parse_int(get(row, col["cpu_milli"]), path, line, "cpu_milli")
        mem = parse_int(get(row, col["memory_mib"]), path, line, "memory_mib")
        ngpu = parse_int(get(row, col["num_gpu"]), path, line, "num_gpu")
        milli_text = get(row, col["gpu_milli"])
        milli = parse_int(milli_text, path, line, "gpu_milli") if milli_text else 0
        if milli > MILLI:
            raise TraceError(path, line, f"gpu_milli: expected 0..1000, got {milli_text!r}")
        models = parse_models(get(row, col["gpu_spec"]), path, line, "gpu_spec")
        qos = get(row, col["qos"])
        if qos not in QOS_PRIORITY:
            raise TraceError(path, line, f"qos: expected one of LS, Guaranteed, Burstable, BE, "
                                         f"got {qos!r}")
        created = parse_float(get(row, col["creation_time"]), path, line, "creation_time")
        deleted = parse_float(get(row, col["deletion_time"]), path, line, "deletion_time")
        sched_text = get(row, col["scheduled_time"])
        started = (parse_float(sched_text, path, line, "scheduled_time") if sched_text
                   else created)
        duration = deleted - started
        if duration <= 0:
            duration, clamped = MIN_DURATION, clamped + 1

        if ngpu == 0:
            shape = (0, 0, cpu, mem, models)
        elif ngpu == 1 and 0 < milli < MILLI:
            shape = (0, milli, cpu, mem, models)
        else:
            shape = (ngpu, 0, cpu, mem, models)
        req = requests.get(shape)
        if req is None:
            g, m, c, mm, mods = shape
            # A CPU-only pod cannot be pinned to a GPU model, so drop any spec it carries.
            req = requests[shape] = Request(gpus=g, gpu_milli=m, cpus_milli=c, memory_mib=mm,
                                            gpu_models=mods if (g or m) else ())
        # The trace's durations are observed pod lifetimes (many pods are services), not work
        # that a faster GPU would finish sooner: they run at the same speed on every model.
        raw.append(RawJob(created, duration, req, get(row, col["name"]), "default",
                          QOS_PRIORITY[qos], line, FIXED_SPEED))
    notes = (f"{clamped} pods with a duration <= 0 ran for {MIN_DURATION:g} s instead",) \
        if clamped else ()
    return build_trace(raw, path, "alibaba", rows.last_line, notes)

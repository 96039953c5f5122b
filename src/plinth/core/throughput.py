"""Per-(job type, GPU model) training speed relative to a V100, for heterogeneity-aware
scheduling (Gavel) and for the simulator's progress rates.

The matrix holds rough relative throughputs in the spirit of Gavel's measurements (Narayanan et
al., OSDI'20, on V100, P100 and K80): compute-bound CNNs gain most from newer GPUs, RL and
recommendation models least. Models missing from a row fall back to the catalog's relative speed.
"""

from __future__ import annotations

from plinth.core.gpus import gpu_model

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


def job_type_for(job_id: int) -> str:
    """A deterministic type for traces that carry none (Philly): spread evenly by id."""
    return JOB_TYPES[(job_id * 2654435761) % len(JOB_TYPES)]


def speed(job_type: str, model: str | None) -> float:
    """Progress per second on one GPU of `model`, relative to the reference V100."""
    if model is None or job_type == FIXED_SPEED:
        return 1.0
    row = THROUGHPUT.get(job_type)
    if row is not None and model in row:
        return row[model]
    return gpu_model(model).speed / gpu_model(REFERENCE_MODEL).speed

"""Robust aggregation, input checks and simulated attacks (client hacking)."""

from plinth.fl.robust.aggregators import (
    AggregateResult,
    bulyan,
    centered_clipping,
    coordinate_median,
    fedavg,
    fltrust,
    krum,
    multi_krum,
    pairwise_sq_distances,
    trimmed_mean,
)
from plinth.fl.robust.checks import CheckResult, check_updates

__all__ = [
    "AggregateResult",
    "CheckResult",
    "bulyan",
    "centered_clipping",
    "check_updates",
    "coordinate_median",
    "fedavg",
    "fltrust",
    "krum",
    "multi_krum",
    "pairwise_sq_distances",
    "trimmed_mean",
]

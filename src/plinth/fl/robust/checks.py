"""Input checks run before aggregation: non-finite updates and implausible num_examples.

A client's num_examples is a weight it chooses itself, so a liar can dominate FedAvg. The checks
reject a report above the declared per-client cap, below 1, or that disagrees with what the
client declared when it enrolled (when the enrolment value is known), each with a logged reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("plinth.fl.robust.checks")


@dataclass(slots=True)
class CheckResult:
    accepted: np.ndarray  # indices of rows that passed
    rejected: dict[int, str] = field(default_factory=dict)  # client id -> reason


def check_updates(
    client_ids: Sequence[int],
    updates: np.ndarray,
    num_examples: Sequence[int],
    *,
    max_examples: int,
    declared_examples: Mapping[int, int] | None = None,
    tolerance: float = 0.0,
    max_norm: float | None = None,
) -> CheckResult:
    """Return which rows may be aggregated; log a one-line reason for each rejected client."""
    u = np.asarray(updates)
    if u.ndim != 2 or u.shape[0] != len(client_ids) or len(num_examples) != len(client_ids):
        raise ValueError(
            f"shape mismatch: {len(client_ids)} ids, updates {u.shape}, {len(num_examples)} num_examples"
        )
    finite = np.all(np.isfinite(u), axis=1)
    norms = np.linalg.norm(np.where(np.isfinite(u), u, 0.0), axis=1)
    ok, rejected = [], {}
    for row, (cid, ne) in enumerate(zip(client_ids, num_examples, strict=True)):
        reason = None
        if not finite[row]:
            reason = "update contains NaN or inf"
        elif not isinstance(ne, (int, np.integer)) or ne < 1:
            reason = f"num_examples={ne!r} is not a positive integer"
        elif ne > max_examples:
            reason = f"num_examples={ne} exceeds the declared cap {max_examples}"
        elif (
            declared_examples is not None
            and cid in declared_examples
            and abs(ne - declared_examples[cid]) > tolerance * declared_examples[cid]
        ):
            reason = f"num_examples={ne} disagrees with the enrolled value {declared_examples[cid]}"
        elif max_norm is not None and norms[row] > max_norm:
            reason = f"update norm {norms[row]:.3g} exceeds max_norm {max_norm:g}"
        if reason is None:
            ok.append(row)
        else:
            log.warning("rejected update from client %s: %s", cid, reason)
            rejected[cid] = reason
    return CheckResult(np.array(ok, dtype=int), rejected)

"""FedBuff (Nguyen et al., AISTATS 2022): asynchronous, buffered aggregation.

Clients train from whatever model version they were given. Each arriving delta is weighted by
1/√(1+s), s being its staleness in model versions, and folded at once. When K updates are
buffered, w ← w + η · (Σ weighted deltas) / K, and the version advances.
"""

from __future__ import annotations

import math

from pydantic import Field

from plinth.fl.aggregate.accumulator import Accumulator
from plinth.fl.strategies.base import Options, Strategy, _axpy_into


class FedBuffOptions(Options):
    buffer_size: int = Field(default=10, ge=1)
    max_staleness: int | None = Field(default=None, ge=0)


class FedBuff(Strategy):
    """Asynchronous buffered aggregation with 1/√(1+staleness) weights (Nguyen et al. 2022)."""

    name = "fedbuff"
    asynchronous = True
    Opts = FedBuffOptions

    def weight(self, num_examples: int, staleness: int) -> float:
        return 1.0 / math.sqrt(1.0 + staleness)

    def refuse(self, staleness: int) -> str | None:
        cap = self.opts.max_staleness  # type: ignore[attr-defined]
        if cap is not None and staleness > cap:
            return f"staleness {staleness} exceeds max_staleness {cap}"
        return None

    def ready(self, acc: Accumulator) -> bool:
        return acc.count >= self.opts.buffer_size  # type: ignore[attr-defined]

    def apply(self, acc: Accumulator) -> None:
        scale = self.opts.server_lr / acc.count
        for p, s in zip(self.parameters, acc.sums()):
            _axpy_into(p, s, scale)

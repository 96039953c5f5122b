"""FedAsync (Xie et al., 2019): mix every update in as it arrives, discounted by staleness.

α_t = α · (1 + s)^(−a) (the paper's polynomial staleness function), and
w ← w + α_t · Δ, the update form of w ← (1 − α_t)·w + α_t·w_client when the client trained
from the current model (exact for s = 0; for s > 0 it does not rewind to the client's old copy,
which would need every past version kept).
"""

from __future__ import annotations

from pydantic import Field

from plinth.fl.aggregate.accumulator import Accumulator
from plinth.fl.strategies.base import Options, Strategy, _axpy_into


class FedAsyncOptions(Options):
    alpha: float = Field(default=0.6, gt=0, le=1)
    staleness_exponent: float = Field(default=0.5, ge=0)


class FedAsync(Strategy):
    """Asynchronous: each update mixed in with α(1+s)^-a (Xie et al. 2019)."""

    name = "fedasync"
    asynchronous = True
    Opts = FedAsyncOptions

    def weight(self, num_examples: int, staleness: int) -> float:
        o = self.opts
        return o.alpha * (1.0 + staleness) ** (-o.staleness_exponent)  # type: ignore[attr-defined]

    def ready(self, acc: Accumulator) -> bool:
        return acc.count >= 1

    def apply(self, acc: Accumulator) -> None:
        for p, s in zip(self.parameters, acc.sums()):
            _axpy_into(p, s, self.opts.server_lr)

"""FedAvgM (Hsu et al., 2019): server momentum on the mean update, v ← βv + Δ, w ← w + ηv."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from plinth.fl.aggregate.accumulator import Accumulator
from plinth.fl.messages import NDArrays
from plinth.fl.strategies.base import Options, Strategy, _axpy_into


class FedAvgMOptions(Options):
    momentum: float = Field(default=0.9, ge=0, lt=1)


class FedAvgM(Strategy):
    """FedAvg with server momentum (Hsu et al. 2019)."""

    name = "fedavgm"
    Opts = FedAvgMOptions

    def initialize(self, parameters: NDArrays) -> None:
        super().initialize(parameters)
        self.velocity: NDArrays = [np.zeros(p.shape, np.float64) for p in self.parameters]

    def apply(self, acc: Accumulator) -> None:
        mean = acc.mean()
        assert mean is not None
        beta, lr = self.opts.momentum, self.opts.server_lr  # type: ignore[attr-defined]
        for p, v, d in zip(self.parameters, self.velocity, mean):
            v *= beta
            v += d
            _axpy_into(p, v, lr)

    def state(self) -> dict[str, NDArrays]:
        return {"velocity": self.velocity}

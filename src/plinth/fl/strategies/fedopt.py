"""FedAdam, FedYogi and FedAdagrad (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

The mean client update Δ is a pseudo-gradient step. With m ← β1·m + (1−β1)·Δ:

- FedAdagrad: v ← v + Δ²
- FedYogi:    v ← v − (1−β2)·Δ²·sign(v − Δ²)
- FedAdam:    v ← β2·v + (1−β2)·Δ²

and w ← w + η·m / (√v + τ). v starts at τ², as in the paper.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from plinth.fl.aggregate.accumulator import Accumulator
from plinth.fl.messages import NDArrays
from plinth.fl.strategies.base import Options, Strategy, _axpy_into


class FedOptOptions(Options):
    server_lr: float = Field(default=0.01, gt=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.99, ge=0, lt=1)
    tau: float = Field(default=1e-3, gt=0)


class _FedOpt(Strategy):
    Opts = FedOptOptions

    def initialize(self, parameters: NDArrays) -> None:
        super().initialize(parameters)
        tau = self.opts.tau  # type: ignore[attr-defined]
        self.m: NDArrays = [np.zeros(p.shape, np.float64) for p in self.parameters]
        self.v: NDArrays = [np.full(p.shape, tau * tau, np.float64) for p in self.parameters]

    def second_moment(self, v: np.ndarray, d2: np.ndarray) -> None:
        raise NotImplementedError

    def apply(self, acc: Accumulator) -> None:
        mean = acc.mean()
        assert mean is not None
        o = self.opts
        for p, m, v, d in zip(self.parameters, self.m, self.v, mean):
            d = d.astype(np.float64)
            m *= o.beta1  # type: ignore[attr-defined]
            m += (1 - o.beta1) * d  # type: ignore[attr-defined]
            self.second_moment(v, d * d)
            _axpy_into(p, m / (np.sqrt(v) + o.tau), o.server_lr)  # type: ignore[attr-defined]

    def state(self) -> dict[str, NDArrays]:
        return {"m": self.m, "v": self.v}


class FedAdagrad(_FedOpt):
    """Adaptive server optimiser: Adagrad on the mean update (Reddi et al. 2021)."""

    name = "fedadagrad"

    def second_moment(self, v: np.ndarray, d2: np.ndarray) -> None:
        v += d2


class FedYogi(_FedOpt):
    """Adaptive server optimiser: Yogi on the mean update (Reddi et al. 2021)."""

    name = "fedyogi"

    def second_moment(self, v: np.ndarray, d2: np.ndarray) -> None:
        v -= (1 - self.opts.beta2) * d2 * np.sign(v - d2)  # type: ignore[attr-defined]


class FedAdam(_FedOpt):
    """Adaptive server optimiser: Adam on the mean update (Reddi et al. 2021)."""

    name = "fedadam"

    def second_moment(self, v: np.ndarray, d2: np.ndarray) -> None:
        b2 = self.opts.beta2  # type: ignore[attr-defined]
        v *= b2
        v += (1 - b2) * d2

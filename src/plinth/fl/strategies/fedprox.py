"""FedProx (Li et al., 2020): FedAvg on the server; clients add (mu/2)·||w − w_global||²."""

from __future__ import annotations

from pydantic import Field

from plinth.fl.messages import Config
from plinth.fl.strategies.base import Options, Strategy


class FedProxOptions(Options):
    proximal_mu: float = Field(default=0.01, ge=0)


class FedProx(Strategy):
    """FedAvg plus a proximal term on clients, sent as `proximal_mu` (Li et al. 2020)."""

    name = "fedprox"
    Opts = FedProxOptions

    def fit_config(self, round: int) -> Config:
        return {"proximal_mu": self.opts.proximal_mu}  # type: ignore[attr-defined]

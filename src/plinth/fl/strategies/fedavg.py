"""FedAvg (McMahan et al., 2017): the example-weighted mean of client updates."""

from __future__ import annotations

from plinth.fl.strategies.base import Strategy


class FedAvg(Strategy):
    """Example-weighted mean of client updates (McMahan et al. 2017)."""

    name = "fedavg"

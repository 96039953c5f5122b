"""Strategies, one file each, and the registry that builds one from a name and options."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from plinth.core.errors import SpecError
from plinth.fl.strategies.base import Strategy
from plinth.fl.strategies.fedasync import FedAsync
from plinth.fl.strategies.fedavg import FedAvg
from plinth.fl.strategies.fedavgm import FedAvgM
from plinth.fl.strategies.fedbuff import FedBuff
from plinth.fl.strategies.fedopt import FedAdagrad, FedAdam, FedYogi
from plinth.fl.strategies.fedprox import FedProx

STRATEGIES: dict[str, type[Strategy]] = {
    c.name: c for c in (FedAvg, FedProx, FedAvgM, FedAdam, FedYogi, FedAdagrad, FedBuff, FedAsync)
}


def make_strategy(name: str, options: dict[str, Any] | None = None, *, threads: int = 1,
                  where: str = "strategy") -> Strategy:
    """Build a strategy; a bad name or option is a one-line `SpecError` naming the field."""
    cls = STRATEGIES.get(name.lower())
    if cls is None:
        raise SpecError(f"{where}.name: unknown strategy {name!r}; choose one of: "
                        f"{', '.join(STRATEGIES)}")
    try:
        return cls(threads=threads, **(options or {}))
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise SpecError(f"{where}.options.{loc}: {err['msg']} (got {err.get('input')!r})") from None


__all__ = ["STRATEGIES", "Strategy", "make_strategy"]

"""Strategies, one file each, and the registry that builds one from a name and options."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from plinth.core.errors import SpecError
from plinth.core.registry import Registry
from plinth.core.spec import errors_message
from plinth.fl.strategies.base import Strategy

# name -> module:class in this package, imported on first use; each class's `name` is the name
# it is registered under.
STRATEGIES: Registry[type[Strategy]] = Registry("strategy")
for _name, _target in (("fedavg", "fedavg:FedAvg"), ("fedprox", "fedprox:FedProx"),
                       ("fedavgm", "fedavgm:FedAvgM"), ("fedadam", "fedopt:FedAdam"),
                       ("fedyogi", "fedopt:FedYogi"), ("fedadagrad", "fedopt:FedAdagrad"),
                       ("fedbuff", "fedbuff:FedBuff"), ("fedasync", "fedasync:FedAsync")):
    STRATEGIES.add(_name, f"{__name__}.{_target}")


def make_strategy(name: str, options: dict[str, Any] | None = None, *,
                  where: str = "strategy") -> Strategy:
    """Build a strategy; a bad name or option is a one-line `SpecError` naming the field."""
    cls = STRATEGIES.get(name, field=f"{where}.name")
    try:
        return cls(**(options or {}))
    except ValidationError as e:
        errors = [{**err, "loc": (*where.split("."), "options", *err["loc"])} for err in e.errors()]
        raise SpecError(errors_message("", errors, cls.Opts)) from None


__all__ = ["STRATEGIES", "Strategy", "make_strategy"]

"""Autoscaling policies, one per file, and the registry that names them."""

from __future__ import annotations

from collections.abc import Callable

from plinth.core.errors import SpecError
from plinth.serve.policies.aiad import Aiad
from plinth.serve.policies.base import Policy, fair_share, fit_quota
from plinth.serve.policies.fair_share import FairShare
from plinth.serve.policies.faro import Faro
from plinth.serve.policies.mark import Mark
from plinth.serve.policies.oneshot import Oneshot
from plinth.serve.policies.ray_serve import RayServe


def _faro(objective: str, drop: bool, name: str) -> Callable[..., Policy]:
    return lambda **kw: Faro(objective=objective, drop=drop, name=name, **kw)


POLICIES: dict[str, Callable[..., Policy]] = {
    "faro-sum": _faro("sum", False, "faro-sum"),
    "faro-fair": _faro("fair", False, "faro-fair"),
    "faro-fairsum": _faro("hybrid", False, "faro-fairsum"),
    "faro-sum-drop": _faro("sum", True, "faro-sum-drop"),
    "faro-fair-drop": _faro("fair", True, "faro-fair-drop"),
    "faro-fairsum-drop": _faro("hybrid", True, "faro-fairsum-drop"),
    "ray-serve": RayServe,
    "oneshot": Oneshot,
    "aiad": Aiad,
    "mark": Mark,
    "fairshare": FairShare,
}


def make_policy(name: str, **kw) -> Policy:
    """The policy called `name`; keyword options go to its constructor (Faro: quantile=…)."""
    key = name.strip().lower()
    if key not in POLICIES:
        raise SpecError(f"--policy: unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    if not key.startswith("faro"):
        kw = {}
    return POLICIES[key](**kw)


__all__ = ["POLICIES", "Aiad", "FairShare", "Faro", "Mark", "Oneshot", "Policy", "RayServe",
           "fair_share", "fit_quota", "make_policy"]

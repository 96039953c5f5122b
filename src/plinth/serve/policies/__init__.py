"""Autoscaling policies, one per file, and the registry that names them."""

from __future__ import annotations

from plinth.core.registry import Registry
from plinth.serve.policies.base import Policy, fair_share, fit_quota

# Modules are imported on first use (Faro's forecaster pulls in scipy.stats). Faro comes in the
# paper's six configurations: objective sum, fair or hybrid ("fairsum"), with or without
# request dropping.
POLICIES: Registry[type[Policy]] = Registry("policy", field="--policy")
for _drop in ("", "-drop"):
    for _name, _objective in (("sum", "sum"), ("fair", "fair"), ("fairsum", "hybrid")):
        POLICIES.add(f"faro-{_name}{_drop}", f"{__name__}.faro:Faro", objective=_objective,
                     drop=bool(_drop), name=f"faro-{_name}{_drop}")
for _name, _target in (("ray-serve", "ray_serve:RayServe"), ("oneshot", "oneshot:Oneshot"),
                       ("hpa", "oneshot:Hpa"),
                       ("aiad", "aiad:Aiad"), ("aiad-faro", "aiad:AiadFaro"), ("mark", "mark:Mark"),
                       ("fairshare", "fair_share:FairShare")):
    POLICIES.add(_name, f"{__name__}.{_target}")

# The policy called `name`; keyword options go to its constructor (Faro: quantile=…).
make_policy = POLICIES.make


__all__ = ["POLICIES", "Policy", "fair_share", "fit_quota", "make_policy"]

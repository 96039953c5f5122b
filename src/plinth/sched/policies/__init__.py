"""Scheduling policies, one file each, chosen by name."""

from __future__ import annotations

import importlib

from plinth.core.errors import SpecError
from plinth.sched.policies.base import Policy

# name -> "module:Class". Modules are imported on first use.
POLICIES: dict[str, str] = {
    "fifo": "plinth.sched.policies.fifo:Fifo",
    "sjf": "plinth.sched.policies.sjf:Sjf",
    "priority": "plinth.sched.policies.priority:StrictPriority",
    "drf": "plinth.sched.policies.drf:FairShare",
    "tiresias": "plinth.sched.policies.tiresias:Tiresias",
    "gavel": "plinth.sched.policies.gavel:Gavel",
    "themis": "plinth.sched.policies.themis:Themis",
}


def make_policy(name: str, **options: object) -> Policy:
    """Build a policy by name; an unknown name is a one-line error listing the known ones."""
    target = POLICIES.get(name.strip().lower())
    if target is None:
        raise SpecError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["POLICIES", "Policy", "make_policy"]

"""Scheduling policies, one file each, chosen by name."""

from __future__ import annotations

from plinth.core.registry import Registry
from plinth.sched.policies.base import Policy

# name -> module:class in this package, imported on first use.
POLICIES: Registry[type[Policy]] = Registry("policy")
for _name, _target in (("fifo", "fifo:Fifo"), ("sjf", "sjf:Sjf"),
                       ("priority", "priority:StrictPriority"), ("drf", "drf:FairShare"),
                       ("tiresias", "tiresias:Tiresias"), ("gavel", "gavel:Gavel"),
                       ("themis", "themis:Themis")):
    POLICIES.add(_name, f"{__name__}.{_target}")

# Build a policy by name and options; an unknown name is a one-line error listing the known ones.
make_policy = POLICIES.make


__all__ = ["POLICIES", "Policy", "make_policy"]

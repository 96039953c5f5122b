"""The control plane's errors beyond `plinth.core.errors`, as the API answers them."""

from __future__ import annotations

from plinth.core.errors import PlinthError


class NotFound(PlinthError):
    """No such job, workload, tenant or token (or another tenant's): HTTP 404."""


class Conflict(PlinthError):
    """Conflicts with the state of what it names: HTTP 409."""

"""Plinth: an ML platform. A fast GPU cluster scheduler, and federated learning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from plinth.client import Client


def __getattr__(name: str) -> Any:
    # `plinth.Client` without importing httpx for users of the scheduler or simulator alone.
    if name == "Client":
        from plinth.client import Client

        return Client
    raise AttributeError(f"module 'plinth' has no attribute {name!r}")


__all__ = ["Client", "__version__"]

"""Plinth: an ML platform. A fast GPU cluster scheduler, and federated learning."""

__version__ = "0.1.0"

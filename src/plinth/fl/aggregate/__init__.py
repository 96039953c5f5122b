"""Aggregation: the streaming engine and the LIFL-style aggregator hierarchy."""

from plinth.fl.aggregate.engine import StreamingAggregator, UpdateRejected, weighted_mean

__all__ = ["StreamingAggregator", "UpdateRejected", "weighted_mean"]

"""Aggregation: the streaming engine (`engine`, compiled with numba) and the LIFL-style
aggregator hierarchy. Import the module you need: this package imports nothing, so that an FL
spec is read without numba."""

"""Runs inside a Dask worker: the supervisor of one rank, the worker's idle rank processes,
the feeder that computes and sends the rank's data, the relay of a live group's commands."""

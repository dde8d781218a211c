"""Shared by the driver, the Dask workers and the rank processes: plain data that travels
between them, run storage and its retries, rules on devices, waiting on Dask futures."""

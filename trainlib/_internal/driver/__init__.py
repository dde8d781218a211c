"""Runs in the driver, the process that calls ``fit()``: the run's attempts (``controller``),
its worker group, the cluster and the workers chosen, reports and checkpoint commits."""

"""What a run cost, where it was spent: MLflow system metrics of the driver and of every host
where a rank runs, on the run's MLflow run.

The driver samples itself with MLflow's own monitor (``system/<metric>``). Each host of a worker
group is sampled by one of its Dask workers with MLflow's metric collectors (CPU, memory, disk,
network, NVIDIA or AMD GPUs) and the driver logs the samples as ``system/<host>/<metric>``
(MLflow's naming for multi-node runs; the host as Dask names it, as in the ranks' placement):
the hosts need no access to the MLflow server.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from mlflow.entities import Metric
from mlflow.environment_variables import MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
from mlflow.tracking import MlflowClient

import trainlib

logger = logging.getLogger(__name__)

SYSTEM_METRICS_INTERVAL_S = 10.0


def sampling_interval_s() -> float:
    """``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``, else ``SYSTEM_METRICS_INTERVAL_S``."""
    return float(MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or SYSTEM_METRICS_INTERVAL_S)


@contextlib.contextmanager
def system_metrics(tracking_uri: str, run_id: str, enabled: bool = True) -> Iterator[None]:
    """Log MLflow's system metrics of this machine (the driver) to the run while the block
    runs: CPU %, memory, disk and network, and each GPU's utilisation and memory where NVML
    finds one; a sample every ``sampling_interval_s()``; a resumed run continues its steps.
    Nothing happens when ``enabled`` is False."""
    if not enabled:
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(
        run_id,
        sampling_interval=sampling_interval_s(),
        resume_logging=True,
        tracking_uri=tracking_uri,
    )
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


@functools.cache
def _collectors() -> tuple[Any, ...]:
    """MLflow's metric collectors of this process's host (the GPU one where a GPU is found)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
    from mlflow.system_metrics.metrics.rocm_monitor import ROCMMonitor

    found: list[Any] = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for gpu_monitor in (GPUMonitor, ROCMMonitor):  # MLflow's order: NVIDIA, then AMD
        try:
            found.append(gpu_monitor())
            break
        except Exception:  # no such GPU or library on this host
            continue
    return tuple(found)


def sample_host() -> dict[str, float]:
    """One sample of this host's system metrics (run on a Dask worker). CPU % is the host's
    since the previous sample (0.0 the first time in a process)."""
    metrics: dict[str, float] = {}
    for collector in _collectors():
        collector.collect_metrics()
        metrics.update(collector.aggregate_metrics())
        collector.clear_metrics()
    return metrics


def metric_prefix(host: str) -> str:
    """``system/<host>/`` with the characters MLflow refuses in a metric name replaced."""
    return f"system/{re.sub(r'[^A-Za-z0-9_./ -]', '_', host)}/"


class HostMetricsCallback(trainlib.TrackingCallback):
    """While a worker group runs, sample every host of its ranks every ``interval_s`` (one
    Dask worker per host, out of band: ``client.run``) and log the samples to the MLflow run,
    step by step; a resumed run continues after its last step. A host that cannot be sampled
    is skipped, and while MLflow is out of reach the samples wait and are logged with the next
    one that reaches it: metrics never stop or hold training.
    """

    service = "MLflow"

    def __init__(self, tracking_uri: str, run_id: str, interval_s: float | None = None) -> None:
        self._client = MlflowClient(tracking_uri)
        self._run_id = run_id
        self._interval_s = interval_s or sampling_interval_s()
        self._step: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_group_start(self, group: trainlib.GroupInfo) -> None:
        if group.client is None:  # local mode: no hosts to sample but this one's own
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._sample, args=(group,), daemon=True, name="host-metrics"
        )
        self._thread.start()

    def on_group_end(self, group: trainlib.GroupInfo) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _sample(self, group: trainlib.GroupInfo) -> None:
        assert group.client is not None, "only a group on a cluster is sampled"
        hosts = {worker: host for host, worker in group.hosts.items()}
        with contextlib.suppress(Exception):  # prime each host's CPU % (since the last call)
            group.client.run(sample_host, workers=list(hosts), on_error="return")
        waiting: list[tuple[int, dict[str, Any]]] = []  # (ms, host -> sample), not yet logged
        while not self._stop.wait(self._interval_s):
            try:
                samples = group.client.run(sample_host, workers=list(hosts), on_error="return")
            except Exception as error:  # the cluster is going away: the group ends next
                logger.debug("Host metrics not sampled: %s", error)
                continue
            waiting.append(
                (int(time.time() * 1000), {hosts[w]: values for w, values in samples.items()})
            )
            try:
                self._log(waiting)
            except Exception as error:
                logger.warning("Host metrics not logged to MLflow (tried again later): %s", error)
                continue
            waiting = []

    def _log(self, waiting: list[tuple[int, dict[str, Any]]]) -> None:
        """Log the samples that wait, one step each, after the run's last logged step."""
        if self._step is None:  # where a resumed run's samples continue (asks MLflow)
            self._step = self._next_step()
        metrics = [
            Metric(metric_prefix(host) + key, float(value), timestamp, self._step + offset)
            for offset, (timestamp, samples) in enumerate(waiting)
            for host, values in samples.items()
            if isinstance(values, dict)
            for key, value in values.items()
        ]
        self._client.log_batch(self._run_id, metrics=metrics)
        self._step += len(waiting)

    def _next_step(self) -> int:
        """One past the last host sample's step on the run (0 for a new run)."""
        keys = [
            key
            for key in self._client.get_run(self._run_id).data.metrics
            if key.startswith("system/")
            and key.endswith("/cpu_utilization_percentage")
            and key.count("/") == 2
        ]
        steps = [m.step for key in keys for m in self._client.get_metric_history(self._run_id, key)]
        return max(steps, default=-1) + 1

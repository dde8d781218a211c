"""The exception hierarchy of trainlib.

::

    TrainlibError
    ├── ConfigError              (also a ValueError)
    ├── DatasetError             (also a ValueError)
    ├── CheckpointError
    ├── RankError                (one rank's failure, as Ray's worker_failures hold it)
    └── TrainingFailedError
        ├── WorkerGroupError     (ranks failed)
        └── ControllerError      (the driver could not run the group)
            └── ClusterError
                └── NotEnoughWorkersError

Every error survives pickling, because Dask ships errors between processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal


class TrainlibError(Exception):
    """Base class of every error raised by trainlib."""


class ConfigError(TrainlibError, ValueError):
    """A configuration value is invalid."""


class DatasetError(TrainlibError, ValueError):
    """A dataset given to ``TorchTrainer(datasets=...)`` cannot be trained on as it is."""


class TrainingFailedError(TrainlibError):
    """The training run failed: ``WorkerGroupError`` (its ranks failed, after
    ``FailureConfig.max_failures``) or ``ControllerError`` (the driver could not run them)."""


class ControllerError(TrainingFailedError):
    """The run failed in the driver, not in a rank (Ray Train v2's ``ControllerError``): the
    cluster cannot run the group (``ClusterError``), or what the ranks reported breaks the
    run's rules (reports made by some ranks only, a validation with no validation function)."""

    @property
    def controller_failure(self) -> BaseException:
        """The error behind it (Ray's attribute): the one this was raised from, else itself."""
        return self.__cause__ or self


class ClusterError(ControllerError):
    """The Dask cluster cannot run the training job."""


class NotEnoughWorkersError(ClusterError):
    """The cluster has fewer eligible Dask workers than ``ScalingConfig.num_workers``."""

    def __init__(
        self,
        *,
        requested: int,
        available: int,
        address: str,
        timeout_s: float,
        resources: str = "",
        num_workers: str = "",
        waiting_for: str = "",
        gpu_shortage: str = "",
        gpus_in_use: str = "",
    ) -> None:
        super().__init__(
            requested,
            available,
            address,
            timeout_s,
            resources,
            num_workers,
            waiting_for,
            gpu_shortage,
            gpus_in_use,
        )
        self.num_workers = num_workers or str(requested)
        self.requested = requested
        self.available = available
        self.address = address
        self.timeout_s = timeout_s
        self.resources = resources
        self.waiting_for = waiting_for  # e.g. the batch jobs not running yet, and why
        self.gpu_shortage = gpu_shortage  # with use_gpu: the hosts with too few devices
        self.gpus_in_use = gpus_in_use  # with use_gpu: the GPUs other runs hold, and by whom

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (partial(NotEnoughWorkersError, **self.__dict__), ())

    def __str__(self) -> str:
        if self.gpus_in_use:
            return (
                f"ScalingConfig(num_workers={self.num_workers}, use_gpu=True) needs "
                f"{self.requested} free GPU(s) but {self.address} has {self.available} "
                f"({self.gpus_in_use}); wait for them to end, lower num_workers, or "
                "add GPU workers to the cluster."
            )
        if self.gpu_shortage:
            return (
                f"ScalingConfig(num_workers={self.num_workers}, use_gpu=True) needs "
                f"{self.requested} Dask workers with a GPU each but {self.address} has "
                f"{self.available} ({self.gpu_shortage}); lower num_workers to the number of "
                "GPUs, or run one Dask worker per GPU."
            )
        kind = f"Dask workers with resources {self.resources}" if self.resources else "Dask workers"
        return (
            f"ScalingConfig(num_workers={self.num_workers}) needs {self.requested} {kind} but "
            f"{self.address} has {self.available} after {self.timeout_s:g} s; "
            + (f"still waiting for {self.waiting_for}; " if self.waiting_for else "")
            + "lower num_workers or add workers to the cluster."
        )


class CheckpointError(TrainlibError):
    """A checkpoint cannot be written, found or read."""


FailureKind = Literal["exception", "exit", "worker_lost", "preempted", "hang", "stopped", "fenced"]


@dataclass(frozen=True)
class RankFailure:
    """What happened to one rank of a failed attempt (plain data, always picklable).

    Attributes:
        world_rank: The rank's global index.
        host: The host the rank ran on.
        kind: ``exception`` (the train function raised), ``exit`` (the process died),
            ``worker_lost`` (its Dask worker left), ``preempted`` (its Dask worker retired
            gracefully: see ``FailureConfig.max_preemption_failures``), ``hang`` (no progress within
            ``FailureConfig.hang_timeout_s``), ``stopped`` (stopped by trainlib after
            another rank failed) or ``fenced`` (stopped itself: its driver was silent for
            ``DaskConfig.driver_timeout_s``; never restarted by the same driver).
        summary: One line: exception type and message, exit code or signal.
        traceback: The formatted traceback, for ``exception`` failures.
        time: Wall-clock time the failure was seen (seconds since the epoch).
        is_collective_error: The exception came out of a torch.distributed collective, so it
            is most likely a consequence of another rank's failure.
    """

    world_rank: int
    host: str
    kind: FailureKind
    summary: str
    traceback: str = ""
    time: float = 0.0
    is_collective_error: bool = False

    def one_line(self) -> str:
        """The failure as one line, naming rank and host."""
        return f"rank {self.world_rank} ({self.host}): {self.summary}"


class RankError(TrainlibError):
    """One rank's failure as an exception, where Ray hands out the exception a worker raised
    (``WorkerGroupError.worker_failures``, ``UserCallback.after_exception``). trainlib ships a
    failure as text between processes: ``failure`` holds its type and message, its traceback
    and where it ran."""

    def __init__(self, failure: RankFailure) -> None:
        super().__init__(failure)
        self.failure = failure

    def __str__(self) -> str:
        return self.failure.one_line()


class WorkerGroupError(TrainingFailedError):
    """One or more ranks failed; shows the root cause once and the other ranks one line each."""

    def __init__(self, failures: dict[int, RankFailure], num_restarts: int = 0) -> None:
        super().__init__(failures, num_restarts)
        self.failures = failures
        self.num_restarts = num_restarts

    @property
    def worker_failures(self) -> dict[int, RankError]:
        """Each failed rank's error by world rank, as Ray Train v2 gives them (``failures``
        holds the same as plain data)."""
        return {rank: RankError(failure) for rank, failure in self.failures.items()}

    @property
    def root_cause(self) -> RankFailure:
        """The failure that most likely started it: not a collective error, then the earliest."""
        candidates = [f for f in self.failures.values() if f.kind != "stopped"] or list(
            self.failures.values()
        )
        return min(candidates, key=lambda f: (f.is_collective_error, f.time, f.world_rank))

    def __str__(self) -> str:
        root = self.root_cause
        restarts = f" after {self.num_restarts} restart(s)" if self.num_restarts else ""
        lines = [
            f"Training failed{restarts}: rank {root.world_rank} on host {root.host}: {root.summary}"
        ]
        if root.traceback:
            lines.append(root.traceback.rstrip())
        others = [f for rank, f in sorted(self.failures.items()) if rank != root.world_rank]
        if others:
            lines.append("Other ranks:")
            lines.extend(f"  {f.one_line()}" for f in others)
        return "\n".join(lines)

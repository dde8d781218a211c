"""Configuration objects: frozen dataclasses, validated when built.

Names and defaults follow Ray Train v2 (``ray.train.ScalingConfig`` etc.); ``DaskConfig`` is
ours and says which Dask cluster runs the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from distributed import Client
    from fsspec import AbstractFileSystem

    from trainlib.callbacks import Callback

DEFAULT_STORAGE_PATH = "~/trainlib_results"


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """How many ranks to run and what each needs.

    Args:
        num_workers: Number of ranks; each runs in its own process next to one Dask worker.
            ``(min, max)`` makes the group elastic: it starts once ``min`` workers are there,
            takes up to ``max``, and re-forms after a failure with as many as are alive then.
            Keep the global batch size constant by deriving the per-rank batch (or gradient
            accumulation) from ``get_context().get_world_size()``.
        use_gpu: Give each rank one CUDA device and use NCCL.
        resources_per_worker: Dask worker resources each rank needs (e.g. ``{"GPU": 1}``);
            only workers that declare them (``dask worker --resources GPU=1``) are used.
        worker_setup: A function of no arguments run once in every rank process, before it
            joins the process group and before ``train_loop_per_worker``: set environment
            variables (``NCCL_SOCKET_IFNAME``), fetch files. ``get_context()`` works in it.
            An exception fails the rank as one raised by the training function would.
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: Mapping[str, float] | None = None
    worker_setup: Callable[[], None] | None = None

    @property
    def worker_range(self) -> tuple[int, int]:
        """``(min, max)`` ranks; both are ``num_workers`` for a fixed size."""
        if isinstance(self.num_workers, tuple):
            return self.num_workers
        return (self.num_workers, self.num_workers)

    def __post_init__(self) -> None:
        low, high = self.worker_range
        if not 1 <= low <= high:
            raise ConfigError(
                f"ScalingConfig(num_workers={self.num_workers}) must be at least 1, and a "
                "(min, max) pair must have 1 <= min <= max."
            )
        for name, amount in (self.resources_per_worker or {}).items():
            if amount <= 0:
                raise ConfigError(
                    f"ScalingConfig(resources_per_worker={{{name!r}: {amount}}}) must be > 0."
                )
        if self.worker_setup is not None and not callable(self.worker_setup):
            raise ConfigError(
                f"ScalingConfig(worker_setup={self.worker_setup!r}) must be a function of no "
                "arguments (or None)."
            )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Which checkpoints to keep.

    Args:
        num_to_keep: Keep this many best checkpoints (``None`` keeps all). The latest
            checkpoint is always kept as well, so a run can resume from it.
        checkpoint_score_attribute: Metric that ranks checkpoints; ``None`` ranks by recency.
        checkpoint_score_order: ``"max"`` or ``"min"``: which end of the score is best.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and self.num_to_keep < 1:
            raise ConfigError(
                f"CheckpointConfig(num_to_keep={self.num_to_keep}) must be None or at least 1."
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ConfigError(
                f"CheckpointConfig(checkpoint_score_order={self.checkpoint_score_order!r}) "
                "must be 'max' or 'min'."
            )


@dataclass(frozen=True, kw_only=True)
class FailureConfig:
    """How often to restart the worker group after a failure, and when a rank counts as hung.

    Args:
        max_failures: Restarts allowed before ``fit()`` raises; ``-1`` means unlimited.
        hang_timeout_s: A rank that has not made the next ``report()`` for this long while the
            run makes no progress is declared hung and the attempt fails (or restarts).
            Collectives then time out after ``2 * hang_timeout_s`` at most. ``None`` derives it
            from the run: after the first report, 5 times the longest interval between two
            reports so far, at least 60 s (before it, only ``TorchConfig.timeout_s`` applies).
    """

    max_failures: int = 0
    hang_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_failures < -1:
            raise ConfigError(
                f"FailureConfig(max_failures={self.max_failures}) must be -1 (unlimited) or >= 0."
            )
        if self.hang_timeout_s is not None and self.hang_timeout_s <= 0:
            raise ConfigError(
                f"FailureConfig(hang_timeout_s={self.hang_timeout_s}) must be positive or None."
            )


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where and how a run is stored and observed.

    Args:
        name: Run name; the run directory is ``{storage_path}/{name}``. ``None`` generates
            ``TorchTrainer_<UTC timestamp>``. Re-using a name resumes from its latest checkpoint.
        storage_path: Local directory or fsspec URL (``s3://bucket/prefix``) shared by all ranks.
        storage_filesystem: An fsspec filesystem to use instead of inferring one from
            ``storage_path`` (e.g. an ``s3fs.S3FileSystem`` with an endpoint).
        checkpoint_config: Checkpoint retention.
        failure_config: Restarts after failures.
        callbacks: Receive run start, every report, and the end (see ``trainlib.Callback``).
    """

    name: str | None = None
    storage_path: str = DEFAULT_STORAGE_PATH
    storage_filesystem: AbstractFileSystem | None = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    callbacks: Sequence[Callback] = ()

    def __post_init__(self) -> None:
        if self.name is not None and (not self.name or "/" in self.name):
            raise ConfigError(f"RunConfig(name={self.name!r}) must be non-empty without '/'.")
        if not self.storage_path:
            raise ConfigError("RunConfig(storage_path='') must name a directory or URL.")


@dataclass(frozen=True, kw_only=True)
class TorchConfig:
    """torch.distributed settings.

    Args:
        backend: ``"gloo"``, ``"nccl"`` or ``None`` (NCCL with GPUs, gloo otherwise).
        timeout_s: Timeout of process-group set-up and collectives.
    """

    backend: Literal["gloo", "nccl"] | None = None
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ConfigError(
                f"TorchConfig(backend={self.backend!r}) must be 'gloo', 'nccl' or None."
            )
        if self.timeout_s <= 0:
            raise ConfigError(f"TorchConfig(timeout_s={self.timeout_s}) must be positive.")


@dataclass(frozen=True, kw_only=True)
class DaskConfig:
    """Which Dask cluster runs the ranks.

    With neither ``address`` nor ``cluster_class``: the scheduler in Dask's own
    ``scheduler-address`` setting ($DASK_SCHEDULER_ADDRESS) if there is one, else a
    ``distributed.LocalCluster`` on 127.0.0.1 with one single-threaded worker per rank, running
    as threads of the calling process (each rank is still a process of its own), closed
    afterwards; ``cluster_kwargs`` override its arguments (e.g. ``{"processes": True}``).
    Follows prefect-dask's conventions.

    Args:
        address: Scheduler address of an existing cluster, e.g. ``"tcp://10.0.0.5:8786"``.
        cluster_class: Import path of a cluster class, e.g. ``"dask_jobqueue.SLURMCluster"``;
            started with ``cluster_kwargs`` and closed by ``fit()``.
        cluster_kwargs: Keyword arguments for the cluster class (or the LocalCluster).
        adapt_kwargs: If set, ``cluster.adapt(**adapt_kwargs)``; otherwise the started
            cluster is scaled to ``num_workers``.
        worker_timeout_s: How long to wait for enough workers before raising
            ``NotEnoughWorkersError``.
    """

    address: str | None = None
    cluster_class: str | None = None
    cluster_kwargs: Mapping[str, Any] = field(default_factory=dict)
    adapt_kwargs: Mapping[str, Any] | None = None
    worker_timeout_s: float = 60.0

    def connect(
        self, num_workers: int = 1, *, wait: bool = False, warm_ranks: bool = False
    ) -> AbstractContextManager[Client]:
        """A client of this cluster, as a context manager; a cluster it starts is closed on exit.

        The one way the pipeline and ``fit()`` get a cluster: a LocalCluster or a cluster
        class is started with ``num_workers`` workers (a cluster class with ``adapt_kwargs``
        adapts instead); with ``address``, the existing cluster is used as it is. With
        ``wait``, the client comes once the cluster has ``num_workers`` workers, or
        ``NotEnoughWorkersError`` after ``worker_timeout_s`` (fail before any work is done).
        With ``warm_ranks``, each worker starts a rank process now (torch imported while the
        caller prepares), so a ``fit()`` on this cluster that follows starts its ranks at once.

        Example:
            >>> with DaskConfig().connect(num_workers=2) as client:
            ...     client.submit(sum, [1, 2]).result()
        """
        from trainlib._internal.driver.cluster import connect

        if num_workers < 1:
            raise ConfigError(f"DaskConfig.connect(num_workers={num_workers}) must be >= 1.")
        return connect(self, num_workers, wait=wait, warm_ranks=warm_ranks)

    def attached_to(self, client: Client) -> DaskConfig:
        """This config pointing at the running cluster of ``client`` (by scheduler address):
        what to hand to code that should use the cluster without starting one."""
        scheduler = client.scheduler
        if scheduler is None:
            raise ConfigError("DaskConfig.attached_to() needs a connected client.")
        return replace(
            self,
            address=scheduler.address,
            cluster_class=None,
            cluster_kwargs={},
            adapt_kwargs=None,
        )

    def __post_init__(self) -> None:
        if self.address and self.cluster_class:
            raise ConfigError(
                "DaskConfig takes address or cluster_class, not both; drop one of them."
            )
        if self.worker_timeout_s <= 0:
            raise ConfigError(
                f"DaskConfig(worker_timeout_s={self.worker_timeout_s}) must be positive."
            )

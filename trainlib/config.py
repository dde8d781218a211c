"""The run's configuration objects: frozen dataclasses, validated when built.

Names and defaults follow Ray Train v2 (``ray.train.ScalingConfig`` etc.). The engine takes
them, so this module imports nothing of it. Which Dask cluster runs the ranks:
``trainlib.DaskConfig`` (``trainlib.dask_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal

from trainlib import ray_hints
from trainlib.errors import ConfigError
from trainlib.logging_config import LoggingConfig

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from trainlib.callbacks import Callback

DEFAULT_STORAGE_PATH = "~/trainlib_results"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"  # Ray's resource label of an accelerator


class Searched:
    """Base of the values a Tuner samples per trial (``tune.grid_search``, ``tune.choice``,
    ...). A ``ScalingConfig`` holding one in ``num_workers`` or a resource amount is a search
    over trial sizes: it belongs in a Tuner's ``param_space["scaling_config"]``."""


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """How many ranks to run and what each needs.

    Args:
        num_workers: Number of ranks; each runs in its own process next to one Dask worker.
            ``0`` is Ray's local mode: the training function runs once in the calling thread,
            without a Dask cluster or a process group (for debugging).
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
        elastic_resize_monitor_interval_s: With ``(min, max)``, how often a healthy group of
            fewer than ``max`` ranks looks for more eligible Dask workers. When there are more
            and a checkpoint was committed since the group formed, the group is re-formed
            larger from that checkpoint (not counted as a failure), as Ray Train does.
        accelerator_type: Ray's accelerator label (``"A100"``, ``"H100"``): only Dask
            workers declaring the resource ``accelerator_type:A100`` (``dask worker
            --resources accelerator_type:A100=1``) take the ranks. Added to
            ``resources_per_worker`` (0.001 a rank, as Ray asks for it).
        trainer_resources, placement_strategy: Ray's, accepted for ported scripts; they have
            no effect here (``trainlib.ray_hints`` says what happens instead, once).

    In a Tuner's ``param_space={"scaling_config": ScalingConfig(...)}``, ``num_workers`` and
    the amounts of ``resources_per_worker`` may be searched (``tune.grid_search([1, 2])``):
    each trial runs at the size it was given.
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: Mapping[str, float] | None = None
    worker_setup: Callable[[], None] | None = None
    elastic_resize_monitor_interval_s: float = 60.0
    accelerator_type: str | None = None
    trainer_resources: Mapping[str, float] | None = None
    placement_strategy: str = "PACK"

    @property
    def worker_range(self) -> tuple[int, int]:
        """``(min, max)`` ranks; both are ``num_workers`` for a fixed size."""
        if isinstance(self.num_workers, tuple):
            return self.num_workers
        return (self.num_workers, self.num_workers)

    @property
    def searched(self) -> dict[str, Any]:
        """The fields a Tuner samples per trial (``{}`` for a plain ScalingConfig)."""
        found: dict[str, Any] = {}
        if isinstance(self.num_workers, Searched):
            found["num_workers"] = self.num_workers
        resources = {
            name: amount
            for name, amount in (self.resources_per_worker or {}).items()
            if isinstance(amount, Searched)
        }
        if resources:
            found["resources_per_worker"] = resources
        return found

    def __post_init__(self) -> None:
        counts = self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers,)
        whole = all(isinstance(n, Integral) and not isinstance(n, bool) for n in counts)
        searched = isinstance(self.num_workers, Searched)
        if not searched and (not whole or len(counts) not in (1, 2)):
            raise ConfigError(
                f"ScalingConfig(num_workers={self.num_workers!r}) must be an int or a (min, max) "
                "pair of ints (or, in a Tuner's param_space, a search: tune.grid_search([...]))."
            )
        low, high = (1, 1) if searched else self.worker_range
        if not (1 <= low <= high or self.num_workers == 0):
            raise ConfigError(
                f"ScalingConfig(num_workers={self.num_workers}) must be at least 1 (or 0: local "
                "mode), and a (min, max) pair must have 1 <= min <= max."
            )
        if self.accelerator_type is not None:
            if not isinstance(self.accelerator_type, str) or not self.accelerator_type:
                raise ConfigError(
                    f"ScalingConfig(accelerator_type={self.accelerator_type!r}) must name an "
                    "accelerator, e.g. 'A100'."
                )
            label = {f"{ACCELERATOR_RESOURCE_PREFIX}{self.accelerator_type}": 0.001}
            resources = {**(self.resources_per_worker or {}), **label}
            object.__setattr__(self, "resources_per_worker", resources)
        for name, amount in (self.resources_per_worker or {}).items():
            if not isinstance(amount, Searched) and amount <= 0:
                raise ConfigError(
                    f"ScalingConfig(resources_per_worker={{{name!r}: {amount}}}) must be > 0."
                )
        if not self.elastic_resize_monitor_interval_s > 0:
            raise ConfigError(
                "ScalingConfig(elastic_resize_monitor_interval_s="
                f"{self.elastic_resize_monitor_interval_s}) must be a number of seconds > 0."
            )
        ray_hints.accept("ScalingConfig", "trainer_resources", self.trainer_resources, None)
        ray_hints.accept("ScalingConfig", "placement_strategy", self.placement_strategy, "PACK")
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
        checkpoint_frequency: For a ``tune.Trainable`` class: save a checkpoint every this
            many iterations (0: never). A function reports its own checkpoints.
        checkpoint_at_end: For a ``tune.Trainable`` class: save one when ``step()`` ends
            the trial (``done=True``).
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and self.num_to_keep < 1:
            raise ConfigError(
                f"CheckpointConfig(num_to_keep={self.num_to_keep}) must be None or at least 1."
            )
        if self.checkpoint_frequency < 0:
            raise ConfigError(
                f"CheckpointConfig(checkpoint_frequency={self.checkpoint_frequency}) must be "
                ">= 0 (0: never)."
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
        max_preemption_failures: Restarts after a preemption, counted apart from
            ``max_failures``; ``-1`` means unlimited. On Dask a preemption is a worker hosting a
            rank that retires gracefully (``client.retire_workers``, a worker's
            ``close_gracefully``, ``dask worker --lifetime``, an adaptive cluster scaling down),
            or whose SLURM job SLURM preempts (its workers retire on SLURM's SIGTERM).
            Once these are used up, a preemption counts as an ordinary failure.
        fail_fast: In a Tuner, the first trial that fails stops the search: every running
            trial ends and no new one starts (as in Ray Tune). ``"raise"``: ``fit()`` then
            raises that trial's error. No effect on a single run.
        relax_collectives_on_preemption: Once ranks are preempted, a ``report()`` is complete
            when the other ranks made it, so they can commit a just-in-time checkpoint on
            their own (rank 0 must survive: else reports still wait for every rank). A
            sharded checkpoint then lacks the preempted ranks' shards.
        preemption_grace_s: How long the other ranks go on after the preempted ones ended (Dask
            gives no deadline to count from), so a checkpoint upload can finish; the attempt
            ends sooner once they committed a checkpoint. ``0``: it ends with them.
    """

    max_failures: int = 0
    hang_timeout_s: float | None = None
    max_preemption_failures: int = 0
    fail_fast: bool | Literal["raise"] = False
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_failures", "max_preemption_failures"):
            if getattr(self, name) < -1:
                raise ConfigError(
                    f"FailureConfig({name}={getattr(self, name)}) must be -1 (unlimited) or >= 0."
                )
        if self.hang_timeout_s is not None and self.hang_timeout_s <= 0:
            raise ConfigError(
                f"FailureConfig(hang_timeout_s={self.hang_timeout_s}) must be positive or None."
            )
        if not self.preemption_grace_s >= 0:
            raise ConfigError(
                f"FailureConfig(preemption_grace_s={self.preemption_grace_s}) must be a number "
                "of seconds >= 0."
            )
        if self.fail_fast not in (True, False, "raise"):
            raise ConfigError(
                f"FailureConfig(fail_fast={self.fail_fast!r}) must be True, False or 'raise'."
            )


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where and how a run is stored and observed.

    Args:
        name: Run name; the run directory is ``{storage_path}/{name}``. ``None`` generates
            ``TorchTrainer_<UTC timestamp>``. Re-using a name resumes from its latest checkpoint.
        storage_path: Local directory or fsspec URL (``s3://bucket/prefix``) shared by all ranks;
            ``None`` (Ray's default too) is ``~/trainlib_results``, fine on one machine only.
        storage_filesystem: An fsspec filesystem to use instead of inferring one from
            ``storage_path`` (e.g. an ``s3fs.S3FileSystem`` with an endpoint).
        checkpoint_config: Checkpoint retention.
        failure_config: Restarts after failures.
        callbacks: Receive run start, every report, and the end (see ``trainlib.Callback``).
        logging_config: The level of trainlib's loggers in the driver and the ranks (None:
            as this process sets them; the ranks' at INFO).
        stop: When a Tuner's trials stop (see ``trainlib.tune.stopper``): a dict of results
            to reach (``{"training_iteration": 10, "mean_accuracy": 0.98}``), a function
            ``(trial_id, result) -> bool`` or a ``tune.Stopper``. A single run ends when its
            training function returns.
        sync_config, verbose, progress_reporter, log_to_file: Ray's, accepted for ported
            scripts; they have no effect here (``trainlib.ray_hints`` says what happens
            instead, once).
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: AbstractFileSystem | None = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    callbacks: Sequence[Callback] = ()
    logging_config: LoggingConfig | None = None
    stop: Any = None  # trainlib.tune.stopper.Stop, checked by the Tuner (this module is below it)
    sync_config: ray_hints.SyncConfig | None = None
    verbose: Any = None
    progress_reporter: Any = None
    log_to_file: bool | str | tuple[str, str] = False

    def __post_init__(self) -> None:
        for name, ray_default in (
            ("sync_config", None),
            ("verbose", None),
            ("progress_reporter", None),
            ("log_to_file", False),
        ):
            ray_hints.accept("RunConfig", name, getattr(self, name), ray_default)
        if self.name is not None and ("/" in self.name or self.name in ("", ".", "..")):
            raise ConfigError(
                f"RunConfig(name={self.name!r}) must be non-empty without '/', and not '.' or "
                "'..' (the run directory is storage_path/name)."
            )
        if self.storage_path is not None and (
            not isinstance(self.storage_path, str) or not self.storage_path
        ):
            raise ConfigError(
                f"RunConfig(storage_path={self.storage_path!r}) must name a directory or URL "
                f"shared by all ranks, or be None for {DEFAULT_STORAGE_PATH}."
            )

    @property
    def storage(self) -> str:
        """Where the run is stored: ``storage_path``, or its default when it is None."""
        return self.storage_path or DEFAULT_STORAGE_PATH

"""``DataParallelTrainer``, as Ray Train's: one function on every rank, data split between
them. trainlib's ranks always join a torch.distributed group, so it is ``TorchTrainer`` with
Ray's ``backend_config`` argument."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trainlib.config import RunConfig, ScalingConfig
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError
from trainlib.torch.trainer import TorchTrainer
from trainlib.torch_config import TorchConfig

if TYPE_CHECKING:
    from distributed import Client

    from trainlib.checkpoint import Checkpoint
    from trainlib.data import DataConfig
    from trainlib.validation import ValidationConfig


class DataParallelTrainer(TorchTrainer):
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` ranks.

    Args:
        backend_config: A ``TorchConfig`` (or None: its defaults). Ray's other backends
            (TensorFlow, Horovod, JAX) have no counterpart here.
        metadata: Ray's run metadata; only None (trainlib keeps none apart from the run's
            reports and checkpoints).

    The other arguments are ``TorchTrainer``'s.

    Raises:
        ConfigError: Another backend config, or metadata.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        backend_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: Mapping[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
        validation_config: ValidationConfig | None = None,
    ) -> None:
        if backend_config is not None and not isinstance(backend_config, TorchConfig):
            raise ConfigError(
                f"DataParallelTrainer(backend_config={type(backend_config).__name__}(...)): "
                "trainlib's ranks join a torch.distributed group; give a trainlib.torch."
                "TorchConfig or None."
            )
        if metadata is not None:
            raise ConfigError(
                "DataParallelTrainer(metadata=...) is not supported: report what you want to "
                "keep with trainlib.report, or log it to your tracker."
            )
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            torch_config=backend_config,
            dask_config=dask_config,
            client=client,
            resume_from_checkpoint=resume_from_checkpoint,
            datasets=datasets,
            dataset_config=dataset_config,
            validation_config=validation_config,
        )

"""Helpers used inside a training function: device, model and data loader preparation."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from trainlib._internal.rank.process_globals import current_session
from trainlib._internal.rank.transfer import move_to_device


def get_device() -> torch.device:
    """This rank's device: its own CUDA device with ``use_gpu=True``, else the CPU."""
    if current_session("torch.get_device()").spec.use_gpu:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_devices() -> list[torch.device]:
    """This rank's devices: one, ``get_device()`` (a rank may see its host's other ranks' GPUs,
    for NCCL's direct links, but uses only its own)."""
    current_session("torch.get_devices()")
    return [get_device()]


def prepare_model(
    model: nn.Module,
    move_to_device: bool = True,
    parallel_strategy: Literal["ddp", "fsdp"] | None = "ddp",
    parallel_strategy_kwargs: Mapping[str, Any] | None = None,
) -> nn.Module:
    """Move ``model`` to this rank's device and make it data-parallel.

    ``"ddp"`` wraps it in ``DistributedDataParallel``; ``"fsdp"`` shards it in place with
    FSDP2's ``torch.distributed.fsdp.fully_shard`` on a 1-D ``DeviceMesh`` of all ranks.
    With one rank (or ``parallel_strategy=None``) the model is returned as it is.

    Args:
        model: The plain module. For ``"fsdp"``, shard its blocks yourself first
            (``fully_shard(block, mesh=...)`` per block, as FSDP2 recommends); this call
            shards the root.
        move_to_device: Move the model to ``get_device()`` first.
        parallel_strategy: ``"ddp"``, ``"fsdp"`` or None.
        parallel_strategy_kwargs: Keyword arguments of ``DistributedDataParallel`` or of
            ``fully_shard`` (``reshard_after_forward``, ``mp_policy``, ``offload_policy``;
            ``mesh`` to use your own).

    Raises:
        TypeError: ``model`` is already wrapped or sharded at its root (prepare it once).
        ValueError: An unknown ``parallel_strategy``.
    """
    spec = current_session("torch.prepare_model()").spec
    if parallel_strategy not in ("ddp", "fsdp", None):
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) must be 'ddp', 'fsdp' or None."
        )
    _check_not_prepared(model)
    device = get_device()
    if move_to_device:
        model = model.to(device)
    if parallel_strategy is None or spec.world_size == 1:
        return model
    kwargs = dict(parallel_strategy_kwargs or {})
    if parallel_strategy == "fsdp":
        return _fully_shard(model, device, spec.world_size, kwargs)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **kwargs)


def _check_not_prepared(model: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, (DistributedDataParallel, FSDPModule)):
        raise TypeError(
            f"prepare_model() got a model already prepared ({type(model).__name__}); "
            "pass the plain nn.Module, once."
        )


def _fully_shard(
    model: nn.Module, device: torch.device, world_size: int, kwargs: dict[str, Any]
) -> nn.Module:
    """FSDP2 on the root module, over all ranks unless ``kwargs`` names a ``mesh``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if "mesh" not in kwargs:
        kwargs["mesh"] = init_device_mesh(device.type, (world_size,))
    fully_shard(model, **kwargs)  # in place: the module's class becomes an FSDPModule
    return model


def prepare_data_loader(
    data_loader: DataLoader[Any], add_dist_sampler: bool = True, move_to_device: bool = True
) -> DataLoader[Any]:
    """Give each rank its own shard of ``data_loader`` and move batches to its device.

    The loader is rebuilt with a ``DistributedSampler`` (shuffling if the original did) and
    the same other settings. The sampler advances its epoch at every pass over the loader;
    calling ``loader.sampler.set_epoch(epoch)`` yourself, as in Ray Train, also works. A
    loader that already has a ``DistributedSampler``, or reads an ``IterableDataset``, keeps
    its sampling, as in Ray Train: shard such data yourself.

    Example:
        >>> loader = prepare_data_loader(DataLoader(dataset, batch_size=64, shuffle=True))
        >>> for x, y in loader: ...
    """
    spec = current_session("torch.prepare_data_loader()").spec
    if (
        add_dist_sampler
        and spec.world_size > 1
        and not isinstance(data_loader.sampler, DistributedSampler)
        and not isinstance(data_loader.dataset, IterableDataset)
    ):
        data_loader = _with_sampler(data_loader, spec.world_size, spec.world_rank)
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _DeviceDataLoader(data_loader, device)
    return data_loader


class _EpochSampler(DistributedSampler[Any]):
    """A DistributedSampler that moves to the next epoch after each pass."""

    def __iter__(self) -> Iterator[Any]:
        indices = super().__iter__()  # computed now, from the current epoch
        self.epoch += 1  # the next pass reshuffles, unless set_epoch() is called first
        return indices


def _with_sampler(loader: DataLoader[Any], world_size: int, world_rank: int) -> DataLoader[Any]:
    if loader.batch_size is None:
        raise TypeError(
            "prepare_data_loader() needs a DataLoader built with batch_size; a custom "
            "batch_sampler cannot be sharded. Pass add_dist_sampler=False and shard yourself."
        )
    sampler = _EpochSampler(
        loader.dataset,
        num_replicas=world_size,
        rank=world_rank,
        shuffle=isinstance(loader.sampler, RandomSampler),
    )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
    )


class _DeviceDataLoader(DataLoader[Any]):
    """The same loader, with every batch moved to a device."""

    def __init__(self, base: DataLoader[Any], device: torch.device) -> None:
        self.__dict__.update(base.__dict__)
        self._base = base
        self._device = device

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        non_blocking = self._device.type == "cuda" and self._base.pin_memory
        for batch in iter(self._base):
            yield move_to_device(batch, self._device, non_blocking)

    def __len__(self) -> int:
        return len(self._base)


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Ray's ``prepare_optimizer``: the optimizer as it is (Ray wraps it only for its
    ``accelerate(amp=True)``; use ``torch.autocast`` and ``torch.amp.GradScaler`` directly)."""
    return optimizer


def backward(tensor: torch.Tensor) -> None:
    """Ray's ``backward``: ``tensor.backward()`` (Ray scales it only under its AMP)."""
    tensor.backward()


def enable_reproducibility(seed: int = 0) -> None:
    """Ray's ``enable_reproducibility``: seed Python's, NumPy's and torch's generators and make
    torch choose deterministic algorithms (slower; cuBLAS told so through
    ``CUBLAS_WORKSPACE_CONFIG``). Call it first in the training function, in every rank."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False

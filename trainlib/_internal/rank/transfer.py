"""Moving a batch (a tensor, or mappings, tuples, named tuples and lists of them) to a device."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor in it on ``device``; other values and the structure kept.

    ``non_blocking`` only overlaps the copy with compute when the source is in pinned memory.
    """
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


class DeviceStager:
    """Copies batches to a CUDA device on a side stream, so the copy overlaps compute.

    ``stage`` runs where batches are prepared (the prefetch thread, or the rank's own for a
    kept shard): it pins each tensor and queues its copy on the side stream. ``ready`` runs
    where the batch is used: the compute stream waits for that copy (on the device, not the
    host), and the copy's memory is marked as used by the compute stream so the allocator does
    not reuse it early. As Ray's ``iter_torch_batches`` does with ``prefetch_batches``.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device)

    def stage(self, batch: Any) -> tuple[Any, torch.cuda.Event]:
        """Queue ``batch``'s copy to the device; returns it with the copy's end event."""
        pinned = _map_tensors(batch, lambda t: t if t.is_pinned() else t.pin_memory())
        with torch.cuda.stream(self._stream):
            moved = move_to_device(pinned, self._device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        return moved, done

    def ready(self, staged: tuple[Any, torch.cuda.Event]) -> Any:
        """The staged batch, safe to use on the current stream."""
        moved, done = staged
        current = torch.cuda.current_stream(self._device)
        current.wait_event(done)
        _map_tensors(moved, lambda t: _record(t, current))
        return moved


def _record(tensor: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    tensor.record_stream(stream)
    return tensor


def _map_tensors(batch: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``function`` applied to each tensor in it; the structure kept."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, Mapping):
        return {k: _map_tensors(v, function) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_map_tensors(v, function) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(v, function) for v in batch)
    return batch

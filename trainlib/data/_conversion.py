"""Batches as the rank wants them: pandas frames, tensors of a dtype, on a device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trainlib._internal.rank.process_globals import current_session

if TYPE_CHECKING:
    import pandas as pd
    import torch

Block = dict[str, np.ndarray]


def host() -> torch.device:
    import torch

    return torch.device("cpu")


def to_pandas(batch: Block) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({k: list(v) if v.ndim > 1 else v for k, v in batch.items()})


def target_device(device: str | torch.device) -> torch.device:
    import torch

    if device != "auto":
        chosen = torch.device(device)
        if chosen.type == "cuda" and chosen.index is None:  # as tensors placed there report it
            return torch.device("cuda", torch.cuda.current_device())
        return chosen
    if current_session("DataIterator.iter_torch_batches()").spec.use_gpu:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def tensor(
    name: str,
    values: np.ndarray,
    dtypes: torch.dtype | Mapping[str, torch.dtype] | None,
    device: torch.device,
) -> torch.Tensor:
    import torch

    if values.dtype == object:
        values = _stacked(name, values)
    dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else dtypes
    tensor = torch.as_tensor(values, dtype=dtype)
    return tensor.to(device, non_blocking=True) if device.type != "cpu" else tensor


def _stacked(name: str, values: np.ndarray) -> np.ndarray:
    """A column of equal-length lists or equal-shape arrays as one array (as Ray Data stacks
    it); anything else (strings, ragged lists) raises, saying what to do."""
    kind = type(values[0]).__name__ if len(values) else "object"
    if len(values) and all(isinstance(v, (list, tuple, np.ndarray)) for v in values):
        try:
            stacked = np.stack([np.asarray(v) for v in values])
        except ValueError:
            raise TypeError(
                f"Column {name!r} holds {kind} values of different lengths, which do not stack "
                "into one tensor; pad or crop them to one length in a map_partitions transform, "
                "or read them with iter_batches()."
            ) from None
        if stacked.dtype != object and stacked.dtype.kind in "biufc":
            return stacked
    raise TypeError(
        f"Column {name!r} holds Python {kind} values, which are not tensors; turn them into "
        "numbers or equal-shape arrays in a map_partitions transform, or read them with "
        "iter_batches()."
    )


def cast(
    batch: dict[str, torch.Tensor], dtypes: torch.dtype | Mapping[str, torch.dtype] | None
) -> dict[str, torch.Tensor]:
    if dtypes is None:
        return batch
    cast = {}
    for name, tensor in batch.items():
        dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else dtypes
        cast[name] = tensor if dtype is None else tensor.to(dtype)
    return cast


def move(value: Any, device: torch.device) -> Any:
    from trainlib._internal.rank.transfer import move_to_device

    return move_to_device(value, device)

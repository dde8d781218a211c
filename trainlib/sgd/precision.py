"""Mixed precision for PyTorchTrainer's train functions: torch.autocast plus a GradScaler.

``use_fp16=True`` trains in float16 with loss scaling on CUDA and in bfloat16 on the CPU
(bfloat16 keeps float32's range: no scaling needed). The default train and validation
functions use it; a custom function asks for the rank's ``MixedPrecision`` with
``get_mixed_precision()`` and runs the same code whether ``use_fp16`` is on or off.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

from trainlib._internal.rank.process_globals import RANK


class MixedPrecision:
    """Autocast context, scaled backward and step: what ``use_fp16`` means for one rank.

    Args:
        enabled: ``use_fp16``; when False every method is the plain float32 operation.
        device: The rank's device: float16 with a GradScaler on CUDA, bfloat16 elsewhere.

    Example:
        >>> precision = trainlib.sgd.get_mixed_precision()
        >>> with precision.autocast():
        ...     output = model(features)
        >>> loss = criterion(precision.to_float(output), target)  # CUDA forbids BCELoss in fp16
        >>> optimizer.zero_grad()
        >>> precision.backward(loss)
        >>> precision.step(optimizer)
    """

    def __init__(self, *, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.device_type = device.type
        self.dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.scaler = torch.amp.GradScaler(device.type, enabled=enabled and device.type == "cuda")

    def autocast(self) -> AbstractContextManager[Any]:
        """The forward pass's context: ``torch.autocast`` in ``dtype`` when enabled."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)

    @staticmethod
    def to_float(output: Any) -> Any:
        """A half-precision output in float32, for the loss: computed outside autocast, as
        CUDA allows some losses (``binary_cross_entropy``) only in float32."""
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.float()
        return output

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, with the loss scaled first under float16."""
        self.scaler.scale(loss).backward()

    def step(self, *optimizers: torch.optim.Optimizer) -> bool:
        """Step each optimizer (skipped by the scaler on inf/NaN gradients), then update the
        scale once.

        Returns:
            False when the scaler skipped the step: a learning-rate scheduler must not step
            then either.
        """
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 0.0
        for optimizer in optimizers:
            self.scaler.step(optimizer)
        self.scaler.update()
        return not self.scaler.is_enabled() or self.scaler.get_scale() >= scale


def get_mixed_precision() -> MixedPrecision:
    """This rank's ``MixedPrecision`` (enabled by ``PyTorchTrainer(use_fp16=True)``).

    Raises:
        RuntimeError: Called outside a PyTorchTrainer's train or validation function.
    """
    current: MixedPrecision | None = RANK.mixed_precision
    if current is None:
        raise RuntimeError(
            "trainlib.sgd.get_mixed_precision() was called outside a PyTorchTrainer rank; "
            "call it inside the train_function or validation_function you gave the trainer."
        )
    return current


def set_mixed_precision(precision: MixedPrecision) -> None:
    """Make ``precision`` this rank's (once, when the rank's runner is built)."""
    RANK.mixed_precision = precision

"""TorchConfig: the torch.distributed settings of a run (Ray's ``ray.train.torch.TorchConfig``;
``trainlib.torch.TorchConfig`` and ``trainlib.TorchConfig`` are this one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainlib.errors import ConfigError


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

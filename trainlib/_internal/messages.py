"""Plain-data messages between the driver, the rank supervisors and the rank processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trainlib._internal.storage import FileEntry, RunStorage
from trainlib.checkpoint import Checkpoint


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank process needs to start; sent to it on its control connection."""

    world_rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    host: str
    master_addr: str
    master_port: int
    backend: Literal["gloo", "nccl"]
    timeout_s: int
    use_gpu: bool
    run_name: str
    storage: RunStorage
    start_index: int
    latest_checkpoint: Checkpoint | None
    train_func_payload: bytes
    sys_path: tuple[str, ...]


@dataclass(frozen=True)
class ReportMessage:
    """One rank's ``report()`` call: rank 0 sends its metrics, every rank its uploaded files."""

    world_rank: int
    index: int
    metrics: dict[str, Any] | None
    files: dict[str, FileEntry] | None

"""What W&B wrote offline: the records of a run's ``.wandb`` file (W&B's LevelDB-style log of
protobuf ``Record``s, read as its format is: a 7-byte file header, then records in 32 KiB
blocks, each with a 7-byte header of checksum, length and kind)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """One offline run as W&B recorded it."""

    run_id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    artifacts: list[str] = field(default_factory=list)


def _chunks(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < 7:  # the rest of a block is padding
            position += left
            continue
        length = int.from_bytes(data[position + 4 : position + 6], "little")
        kind = data[position + 6]
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk


def read_run(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    run = OfflineRun()
    for chunk in _chunks(path):
        record = pb.Record()
        record.ParseFromString(chunk)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name = record.run.run_id, record.run.display_name
            run.group, run.project = record.run.run_group, record.run.project
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            row = {
                "/".join(i.nested_key) or i.key: json.loads(i.value_json)
                for i in record.history.item
            }
            run.history.append({k: v for k, v in row.items() if not k.startswith("_")})
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
        elif kind == "artifact":
            run.artifacts.append(record.artifact.name)
    return run


def _items(items: Any) -> dict[str, Any]:
    return {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items}


def offline_runs(root: Path) -> list[OfflineRun]:
    """Every offline run under ``root``, by run id."""
    found = [read_run(path) for path in root.rglob("offline-run-*/run-*.wandb")]
    return sorted(found, key=lambda run: run.run_id)

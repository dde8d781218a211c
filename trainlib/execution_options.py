"""Ray Data's execution options, as hints: what Dask honours, and what it cannot.

``DataConfig(execution_options=...)`` takes Ray's ``ExecutionOptions`` (one for every dataset,
or a dict of them by dataset name) so that a Ray page runs as written. Dask honours what it
does anyway: partitions reach each rank in order (``preserve_order``; unless
``DataConfig(shuffle_seed=...)`` reorders them on purpose) and its scheduler runs each read
next to its data where it can (``locality_with_output=True``). Resource limits and node lists
have no counterpart: they are named in one warning, and the run goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_INGEST_MEMORY = 2 * 1024**3  # Ray's default ingest budget per worker (object store bytes)


@dataclass
class ExecutionResources:
    """Ray's resource amounts (``None``: no limit); mutable as Ray's, or ``copy(**changes)``."""

    cpu: float | None = None
    gpu: float | None = None
    object_store_memory: float | None = None
    memory: float | None = None

    def copy(self, **changes: Any) -> ExecutionResources:
        """A copy with ``changes`` (Ray's ``ExecutionResources.copy``)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def zero(cls) -> ExecutionResources:
        """No resources (Ray's ``exclude_resources`` default)."""
        return cls(cpu=0, gpu=0, object_store_memory=0, memory=0)


@dataclass
class ExecutionOptions:
    """Ray Data's ``ExecutionOptions``: the fields Ray's pages set."""

    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)
    exclude_resources: ExecutionResources = field(default_factory=ExecutionResources.zero)
    locality_with_output: bool | list[str] = False
    preserve_order: bool = False
    actor_locality_enabled: bool = True
    verbose_progress: bool = False


def default_ingest_options() -> ExecutionOptions:
    """Ray Train's defaults for ingest: output locality, a 2 GiB memory budget."""
    return ExecutionOptions(
        resource_limits=ExecutionResources(object_store_memory=_INGEST_MEMORY),
        locality_with_output=True,
    )


def unapplied(options: ExecutionOptions | Mapping[str, ExecutionOptions]) -> list[str]:
    """The hints Dask cannot honour, each with what to use instead (none for the defaults)."""
    per_dataset = options if isinstance(options, Mapping) else {"": options}
    found: list[str] = []
    for name, one in per_dataset.items():
        where = f"[{name!r}]" if name else ""
        default = default_ingest_options()
        limits = {
            key: value
            for key, value in dataclasses.asdict(one.resource_limits).items()
            if value is not None and value != getattr(default.resource_limits, key)
        }
        if limits:
            found.append(
                f"execution_options{where}.resource_limits {limits} (limit a worker's memory "
                "with `dask worker --memory-limit`, a rank's read-ahead with "
                "iter_batches(prefetch_batches=...))"
            )
        if one.exclude_resources != ExecutionResources.zero():
            found.append(f"execution_options{where}.exclude_resources (Dask reserves none)")
        if isinstance(one.locality_with_output, list):
            found.append(
                f"execution_options{where}.locality_with_output=[node ids] (Dask places each "
                "read next to its data and its rank; start workers where the data is)"
            )
    return found


def check_type(options: object) -> None:
    """Raise ``TypeError`` unless ``options`` is ExecutionOptions or a dict of them."""
    values = options.values() if isinstance(options, Mapping) else [options]
    if not all(isinstance(value, ExecutionOptions) for value in values):
        raise TypeError(
            f"DataConfig(execution_options={options!r}) takes ExecutionOptions (from "
            "DataConfig.default_ingest_options()) or a dict of them by dataset name."
        )

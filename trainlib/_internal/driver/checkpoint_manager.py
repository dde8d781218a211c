"""Which committed checkpoints to keep (``CheckpointConfig``), and deleting the rest."""

from __future__ import annotations

import logging
import math
from typing import Any

from trainlib._internal.common.checkpoint import Checkpoint
from trainlib._internal.common.config import CheckpointConfig
from trainlib._internal.common.storage import CommittedCheckpoint, RunStorage

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Keeps the best ``num_to_keep`` checkpoints plus the latest; deletes the others."""

    def __init__(self, config: CheckpointConfig, storage: RunStorage) -> None:
        self._config = config
        self._storage = storage
        self._kept: list[CommittedCheckpoint] = []

    @classmethod
    def from_storage(cls, config: CheckpointConfig, storage: RunStorage) -> CheckpointManager:
        """A manager holding the checkpoints already committed in the run directory."""
        manager = cls(config, storage)
        for committed in storage.list_committed():
            manager.register(committed)
        return manager

    @property
    def latest(self) -> CommittedCheckpoint | None:
        """The most recently reported checkpoint."""
        return max(self._kept, key=lambda c: c.index, default=None)

    @property
    def committed(self) -> list[CommittedCheckpoint]:
        """Kept checkpoints in the order they were reported."""
        return sorted(self._kept, key=lambda c: c.index)

    @property
    def kept(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """Kept checkpoints with their metrics, best first."""
        return [(c.checkpoint, c.metrics) for c in sorted(self._kept, key=self._rank)]

    def latest_intact(self) -> CommittedCheckpoint | None:
        """The newest checkpoint whose files match their commit marker.

        Newer ones that do not are deleted, with a warning: they can never be loaded.
        """
        while (latest := self.latest) is not None:
            problem = self._storage.verify(latest)
            if problem is None:
                return latest
            logger.warning(
                "Checkpoint %s is corrupt (%s); deleting it and resuming from the one before.",
                latest.checkpoint,
                problem,
            )
            self._storage.delete(latest.checkpoint)
            self._kept.remove(latest)
        return None

    def register(self, committed: CommittedCheckpoint) -> None:
        """Add a newly committed checkpoint and delete the ones that fall out."""
        self._kept.append(committed)
        limit = self._config.num_to_keep
        if limit is None or len(self._kept) <= limit:
            return
        latest = self.latest
        best = sorted(self._kept, key=self._rank)[:limit]
        keep = {id(c) for c in best} | {id(latest)}
        for dropped in [c for c in self._kept if id(c) not in keep]:
            logger.debug("Deleting checkpoint %s (not in the best %d)", dropped.checkpoint, limit)
            self._storage.delete(dropped.checkpoint)
        self._kept = [c for c in self._kept if id(c) in keep]

    def _rank(self, committed: CommittedCheckpoint) -> tuple[float, int]:
        """Sort key, best first: by score (missing scores last), then newest first."""
        attribute = self._config.checkpoint_score_attribute
        if attribute is None:
            return (0.0, -committed.index)
        score = committed.metrics.get(attribute)
        if not isinstance(score, (int, float)) or math.isnan(score):
            return (math.inf, -committed.index)
        return (-score if self._config.checkpoint_score_order == "max" else score, -committed.index)

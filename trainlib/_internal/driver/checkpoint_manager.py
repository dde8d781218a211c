"""Which committed checkpoints to keep (``CheckpointConfig``), and deleting the rest; which
are validated, or waiting for a validation (never deleted meanwhile)."""

from __future__ import annotations

import logging
import math
from typing import Any

from trainlib._internal.common.commit_marker import CommittedCheckpoint
from trainlib._internal.common.storage import RunStorage
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig
from trainlib.validation import ReportedCheckpointStatus

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Keeps the best ``num_to_keep`` checkpoints plus the latest and those waiting for a
    validation; deletes the others."""

    def __init__(self, config: CheckpointConfig, storage: RunStorage) -> None:
        self._config = config
        self._storage = storage
        self._kept: list[CommittedCheckpoint] = []
        self._validating: set[int] = set()  # report indices whose validation has not ended

    @classmethod
    def from_storage(cls, config: CheckpointConfig, storage: RunStorage) -> CheckpointManager:
        """A manager holding the checkpoints already committed in the run directory."""
        manager = cls(config, storage)
        for committed in storage.list_committed():
            manager.register(committed, validating=committed.validation is not None)
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
    def validating(self) -> frozenset[int]:
        """The report indices of the checkpoints waiting for their validation."""
        return frozenset(self._validating)

    def awaiting_validation(self) -> list[CommittedCheckpoint]:
        """The checkpoints whose validation was asked for and has not ended (a run of this
        name stopped before it did), oldest first."""
        return [c for c in self.committed if c.index in self._validating]

    def status(self, committed: CommittedCheckpoint) -> ReportedCheckpointStatus:
        """Whether ``committed`` is validated, waiting for its validation, or neither."""
        if committed.index in self._validating:
            return ReportedCheckpointStatus.PENDING_VALIDATION
        if committed.validated:
            return ReportedCheckpointStatus.VALIDATED
        return ReportedCheckpointStatus.COMMITTED

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

    def register(self, committed: CommittedCheckpoint, validating: bool = False) -> None:
        """Add a newly committed checkpoint (``validating``: a validation of it is to come)
        and delete the ones that fall out."""
        self._kept.append(committed)
        if validating:
            self._validating.add(committed.index)
        self._prune()

    def validated(self, index: int, metrics: dict[str, Any] | None) -> CommittedCheckpoint | None:
        """The validation of checkpoint ``index`` ended: its ``metrics`` are merged into the
        checkpoint's (None: it failed; the metrics stay) and its marker says so. Returns the
        checkpoint as it now is, or None if it is gone."""
        self._validating.discard(index)
        found = next((c for c in self._kept if c.index == index), None)
        if found is not None:
            merged = None if metrics is None else {**found.metrics, **metrics}
            updated = self._storage.record_validation(found, merged)
            self._kept[self._kept.index(found)] = found = updated
        self._prune()
        return found if any(c is found for c in self._kept) else None

    def _prune(self) -> None:
        """Delete the checkpoints that are neither the best ``num_to_keep``, the latest, nor
        waiting for their validation."""
        limit = self._config.num_to_keep
        if limit is None or len(self._kept) <= limit:
            return
        latest = self.latest
        best = sorted(self._kept, key=self._rank)[:limit]
        waiting = {id(c) for c in self._kept if c.index in self._validating}
        keep = {id(c) for c in best} | {id(latest)} | waiting
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

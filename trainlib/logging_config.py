"""LoggingConfig: how much trainlib's own loggers say (Ray Train's ``ray.train.LoggingConfig``)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from trainlib.errors import ConfigError

LOGGER = "trainlib"  # the logger whose level LoggingConfig sets, in the driver and the ranks
_ACTIVE: Counter[int] = Counter()  # the levels of the runs going on in this process
_LOCK = threading.Lock()
_BEFORE: list[int] = []  # the logger's own level before the first of them


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    """The level of the ``trainlib`` logger (and its children) for a run, as Ray's sets the
    ``ray.train`` logger's: in the process that calls ``fit()`` while it runs, and in every
    rank. The training function's own loggers keep theirs (rank 0 forwards its records at
    INFO and above, as before).

    Args:
        log_level: A ``logging`` level name: ``"DEBUG"``, ``"INFO"`` (the default),
            ``"WARNING"``, ``"ERROR"`` or ``"CRITICAL"``.
    """

    log_level: str | None = "INFO"

    def __post_init__(self) -> None:
        if self.log_level is None:  # LoggingConfig.of(None): the levels as they are
            return
        if not isinstance(self.log_level, str) or not isinstance(
            logging.getLevelName(self.log_level.upper()), int
        ):
            raise ConfigError(
                f"LoggingConfig(log_level={self.log_level!r}) must be a logging level name: "
                "'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'."
            )

    @classmethod
    def of(cls, config: LoggingConfig | None) -> LoggingConfig:
        """``config``, or for none one that leaves the driver's levels as they are."""
        return config if config is not None else cls(log_level=None)

    @property
    def level(self) -> int:
        """The level as ``logging``'s number (INFO when none is set)."""
        level: int = logging.getLevelName((self.log_level or "INFO").upper())
        return level

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The ``trainlib`` logger at this level while a run goes on in this process: with
        several at once (a search's trials), the most verbose of theirs; afterwards its own.
        Without a level, nothing changes."""
        if self.log_level is None:
            yield
            return
        logger = logging.getLogger(LOGGER)
        with _LOCK:
            if not _ACTIVE:
                _BEFORE[:] = [logger.level]
            _ACTIVE[self.level] += 1
            logger.setLevel(min(_ACTIVE))
        try:
            yield
        finally:
            with _LOCK:
                _ACTIVE[self.level] -= 1
                if not _ACTIVE[self.level]:
                    del _ACTIVE[self.level]
                logger.setLevel(min(_ACTIVE) if _ACTIVE else _BEFORE[0])

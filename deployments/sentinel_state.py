"""What the sentinel keeps across restarts, in one JSON file written whole each round.

Its incidents (so a restart neither repeats an alert nor restarts an incident's clock), the
server times of its stored events (``watch_rules.silence``), the alerts the webhook has not
taken yet, and when its last round ended: the container's healthcheck
(``python -m deployments.sentinel --healthcheck``) reads that.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("deployments.sentinel")

STATE_VARIABLE = "CIFAR_SENTINEL_STATE"


def default_path() -> Path:
    """``$CIFAR_SENTINEL_STATE``, else ``$XDG_STATE_HOME/dask-train-cifar/sentinel.json``."""
    if found := os.environ.get(STATE_VARIABLE):
        return Path(found)
    home = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(home) / "dask-train-cifar" / "sentinel.json"


@dataclass
class SavedState:
    """The sentinel's state between rounds (and processes)."""

    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)
    stored: list[list[Any]] = field(default_factory=list)  # [received, fresh]: watch_rules
    unsent: list[list[str]] = field(default_factory=list)  # [subject, body] not taken yet
    last_round: float | None = None


def load(path: Path) -> SavedState:
    """The state saved at ``path``; a fresh one (saying why) when there is none or it is
    unreadable (a file cut short by a full disk: the sentinel goes on, it does not stop)."""
    try:
        saved = json.loads(path.read_text())
        return SavedState(**{k: saved[k] for k in SavedState.__dataclass_fields__ if k in saved})
    except FileNotFoundError:
        return SavedState()
    except (OSError, ValueError, TypeError) as error:
        logger.warning("Starting afresh: the saved state %s is unreadable (%s)", path, error)
        return SavedState()


def save(path: Path, state: SavedState) -> None:
    """Write ``state`` to ``path`` whole or not at all (a new file renamed over the old)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
        try:
            json.dump(asdict(state), out)
            out.flush()
        except BaseException:
            os.unlink(out.name)
            raise
    os.replace(out.name, path)


def unhealthy(path: Path, now: float, max_age_s: float) -> str | None:
    """Why the sentinel is not healthy (no round ended within ``max_age_s``), or None."""
    last = load(path).last_round
    if last is None:
        return f"no round has ended yet ({path} holds none)"
    if now - last > max_age_s:
        return f"its last round ended {now - last:.0f} s ago (more than {max_age_s:.0f} s)"
    return None

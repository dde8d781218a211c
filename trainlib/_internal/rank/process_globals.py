"""The rank process's own state, in one place: ``RANK``.

A rank process runs one training function and is never reused, so what it keeps is kept for
the whole process: the session the function reports through (which owns the upload helper
process), what the front ends keep for it (its ``get_dataset_shard`` iterators,
``trainlib.sgd``'s mixed precision and scheduler step), and the environment it started with.
Nothing else in a rank is module-level state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trainlib._internal.common.messages import Command
from trainlib._internal.rank.session import Session


@dataclass
class RankGlobals:
    """What this rank process keeps; the front ends' objects are typed loosely (``Any``)
    because the engine never imports the front ends."""

    session: Session | None = None
    started_with: dict[str, str] = field(default_factory=dict)  # the environment at start
    dataset_iterators: dict[str, Any] = field(default_factory=dict)  # name -> DataIterator
    mixed_precision: Any = None  # trainlib.sgd's MixedPrecision, once its loop chose one
    scheduler_step_freq: Literal["batch", "epoch"] = "batch"  # trainlib.sgd's default passes

    def start(self, session: Session) -> None:
        """Make ``session`` the current one (once per rank process)."""
        self.session = session

    def reset(self) -> None:
        """Forget the session and what the front ends kept (tests run sessions in-process)."""
        self.session = None
        self.dataset_iterators.clear()
        self.mixed_precision = None
        self.scheduler_step_freq = "batch"


RANK = RankGlobals()


def next_command() -> Command:
    """Block until the driver sends this rank its next command (a live group's rank loop)."""
    return current_session("next_command()").commands.get()


def current_session(caller: str) -> Session:
    """The current session; raises a RuntimeError naming ``caller`` outside a training function."""
    session = RANK.session
    if session is None:
        raise RuntimeError(
            f"trainlib.{caller} was called outside a training function; call it inside the "
            "train_loop_per_worker that TorchTrainer runs on every rank."
        )
    return session

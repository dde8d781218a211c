"""trainlib.air.session outside a training function: Ray AIR's names, trainlib's guard."""

from __future__ import annotations

import pytest

import trainlib
from trainlib.air import session


@pytest.mark.parametrize(
    "call",
    [
        session.get_world_size,
        session.get_world_rank,
        session.get_local_rank,
        session.get_checkpoint,
    ],
)
def test_session_outside_a_training_function_names_the_fix(call: object) -> None:
    with pytest.raises(RuntimeError, match="inside the train_loop_per_worker"):
        call()  # type: ignore[operator]


def test_air_reexports_trainlib_configs() -> None:
    from trainlib import air

    assert air.ScalingConfig is trainlib.ScalingConfig
    assert air.RunConfig is trainlib.RunConfig
    assert air.Checkpoint is trainlib.Checkpoint

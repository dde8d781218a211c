"""A rank's session files what the driver sends by its type: blocks by dataset, the answer to
a checkpoints query, a preemption notice and a live group's commands, each in its own place
(a dataset may be named anything, even like one of the others)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from tests.helpers import single_rank_spec
from trainlib import Checkpoint
from trainlib._internal.common.messages import (
    CheckpointsAnswer,
    Command,
    DataBlock,
    PreemptionNotice,
    ToRank,
)
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.rank.session import Session
from trainlib.preemption import PreemptionInfo
from trainlib.validation import ReportedCheckpointStatus

NAMES = ("train", "reported_checkpoints", "preemption", "commands")


def _session(tmp_path: Path) -> Session:
    storage = RunStorage(LocalFileSystem(), str(tmp_path))
    return Session(single_rank_spec(storage, NAMES), lambda message: None)


@pytest.mark.parametrize("order", range(6))
def test_each_message_is_filed_by_its_type(tmp_path: Path, order: int) -> None:
    session = _session(tmp_path)
    answer = CheckpointsAnswer(
        [(Checkpoint(str(tmp_path)), {"loss": 1.0}, ReportedCheckpointStatus.COMMITTED)]
    )
    notice = PreemptionNotice(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={}))
    messages: list[ToRank] = [
        *(DataBlock(name, 0, f"block of {name}") for name in NAMES),
        answer,
        notice,
        Command("train"),
        Command("validate", {"step": 1}),
    ]
    rotated = messages[order:] + messages[:order]  # the order they come in changes nothing
    for message in rotated:
        session.deliver(message)
    for name in NAMES:
        assert session.inbox(name).get_nowait() == (0, f"block of {name}")
        assert session.inbox(name).empty()
    assert session.answers.get_nowait() is answer and session.answers.empty()
    assert session.preemption is notice.info
    commands = [session.commands.get_nowait() for _ in range(2)]
    assert [c.kind for c in commands] == [
        m.kind for m in rotated if isinstance(m, Command)
    ] and session.commands.empty()

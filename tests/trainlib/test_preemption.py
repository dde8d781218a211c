"""What a rank is told of a preemption (``get_preemption_info``), as Ray Train's API."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import trainlib
from trainlib import PreemptionInfo, RunConfig, ScalingConfig
from trainlib._internal.common.messages import PreemptionNotice
from trainlib._internal.rank.process_globals import RANK
from trainlib.torch import TorchTrainer

NOTICE = PreemptionInfo(
    deadline_ms=None, preempted_node_to_ranks={"tcp://b:2": [3, 2], "tcp://a:1": [0]}
)


def test_preemption_info_lists_workers_and_ranks_sorted() -> None:
    assert NOTICE.preempted_node_ids == ["tcp://a:1", "tcp://b:2"]
    assert NOTICE.preempted_ranks == [0, 2, 3]


def _notice_before_and_after(config: dict[str, Any]) -> None:
    before = trainlib.get_preemption_info()
    assert RANK.session is not None
    RANK.session.deliver(PreemptionNotice(NOTICE))  # as the supervisor relays it
    after = trainlib.get_preemption_info()
    assert after is not None
    trainlib.report({"before": before, "after": asdict(after)})  # metrics travel as JSON data


def test_preemption_notice_reaches_get_preemption_info(tmp_path: Path) -> None:
    result = TorchTrainer(
        _notice_before_and_after,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(storage_path=str(tmp_path)),
    ).fit()
    assert result.metrics == {"before": None, "after": asdict(NOTICE)}


def test_preemption_info_outside_a_training_function_says_where_to_call_it() -> None:
    with pytest.raises(RuntimeError, match=r"get_preemption_info\(\) was called outside"):
        trainlib.get_preemption_info()

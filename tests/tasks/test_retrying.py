"""A step retries an outage for as long as the outage tolerance, counted from its start."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prefect.client.schemas.objects import TaskRun
from prefect.states import Completed, Failed

from tasks.retrying import transient_failure


def _failed(error: Exception) -> object:
    return Failed(data=error)


def _run(started_s_ago: float) -> TaskRun:
    started = datetime.now(timezone.utc) - timedelta(seconds=started_s_ago)
    return TaskRun(task_key="register", dynamic_key="0", start_time=started)


def test_retrying_an_outage_is_retried_within_the_tolerance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CIFAR_OUTAGE_TOLERANCE_S", "300")
    refused = ConnectionRefusedError("refused")
    assert transient_failure(None, _run(10), _failed(refused))
    assert not transient_failure(None, _run(301), _failed(refused))


def test_retrying_a_bad_input_or_a_success_is_not_retried() -> None:
    assert not transient_failure(None, _run(1), _failed(ValueError("bad shape")))
    assert not transient_failure(None, _run(1), Completed())

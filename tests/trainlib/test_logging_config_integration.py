"""Ray Train's ``RunConfig(logging_config=LoggingConfig(log_level=...))``: the level of
trainlib's own loggers in the driver while a run goes on and in its ranks; the training
function's own loggers keep theirs."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from distributed import Client

from trainlib import ConfigError, LoggingConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer


def log_at_each_level(config: dict[str, Any]) -> None:
    logging.getLogger("trainlib.in_rank").debug("trainlib debug from the rank")
    logging.getLogger("trainlib.in_rank").info("trainlib info from the rank")
    logging.getLogger("my_project").debug("user debug from the rank")
    logging.getLogger("my_project").info("user info from the rank")


def _messages(caplog: pytest.LogCaptureFixture) -> set[tuple[str, str]]:
    return {(r.name.split(".")[0], r.getMessage()) for r in caplog.records}


@pytest.mark.parametrize(
    ("level", "trainlib_from_rank", "driver_info"),
    [
        ("DEBUG", {"trainlib debug from the rank", "trainlib info from the rank"}, True),
        ("WARNING", set(), False),
    ],
)
def test_log_level_applies_to_trainlib_in_driver_and_ranks(
    dask_client: Client,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
    level: str,
    trainlib_from_rank: set[str],
    driver_info: bool,
) -> None:
    caplog.set_level(logging.DEBUG)  # every record that is made reaches the capture
    before = logging.getLogger("trainlib").level
    logging.getLogger("trainlib").setLevel(logging.INFO)
    TorchTrainer(
        log_at_each_level,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path), logging_config=LoggingConfig(log_level=level)
        ),
        client=dask_client,
    ).fit()
    seen = _messages(caplog)
    from_rank = {m for name, m in seen if name == "trainlib" and "from the rank" in m}
    assert from_rank == trainlib_from_rank
    # the user's loggers: rank 0's at INFO and above, whatever trainlib's level
    assert ("my_project", "user info from the rank") in seen
    assert ("my_project", "user debug from the rank") not in seen
    driver = [r for r in caplog.records if r.name.startswith("trainlib._internal.driver")]
    assert any(r.levelno == logging.INFO for r in driver) is driver_info
    assert logging.getLogger("trainlib").level == logging.INFO  # as it was, after the run
    logging.getLogger("trainlib").setLevel(before)


def test_logging_config_is_checked_and_overlapping_runs_restore_the_level() -> None:
    with pytest.raises(ConfigError, match="must be a logging level name"):
        LoggingConfig(log_level="LOUD")
    logger = logging.getLogger("trainlib")
    before = logger.level
    logger.setLevel(logging.ERROR)
    verbose, quiet = LoggingConfig(log_level="debug"), LoggingConfig(log_level="WARNING")
    entered, release = threading.Event(), threading.Event()

    def other_run() -> None:
        with quiet.applied():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other_run)
    with verbose.applied():
        thread.start()
        entered.wait(10)
        assert logger.level == logging.DEBUG  # the most verbose of the runs going on
    assert logger.level == logging.WARNING  # the other run still goes on
    release.set()
    thread.join(10)
    assert logger.level == logging.ERROR  # as before either
    with LoggingConfig.of(None).applied():
        assert logger.level == logging.ERROR  # none given: untouched
    logger.setLevel(before)

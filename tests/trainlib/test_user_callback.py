"""Ray Train v2's ``UserCallback`` and ``ControllerError`` by import swap: a callback written
for ``ray.train`` runs as written, in the process that called ``fit()``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

import trainlib
from trainlib import (
    Checkpoint,
    ControllerError,
    FailureConfig,
    RankError,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    UserCallback,
    WorkerGroupError,
)
from trainlib.torch import TorchTrainer
from trainlib.v2.api.callback import UserCallback as V2UserCallback
from trainlib.v2.api.exceptions import ControllerError as V2ControllerError


class RecordingCallback(UserCallback):
    """As Ray's guide writes one: it keeps what it is told."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, int, list[dict[str, Any]], str | None]] = []
        self.exceptions: list[dict[int, Exception]] = []

    def after_report(self, run_context, metrics, checkpoint):  # type: ignore[no-untyped-def]
        name = checkpoint.path.rsplit("/", 1)[-1] if checkpoint is not None else None
        self.reports.append((run_context.run_name, run_context.world_size, metrics, name))

    def after_exception(self, run_context, worker_exceptions):  # type: ignore[no-untyped-def]
        self.exceptions.append(worker_exceptions)


def _train(config: dict[str, Any]) -> None:
    once = Path(config["fail_once"]) if "fail_once" in config else None
    for epoch in range(config["epochs"]):
        if epoch == config.get("fail_at") and (once is None or not once.exists()):
            if once is not None:
                once.touch()  # the restart passes here
            raise ValueError(f"the loss is NaN at epoch {epoch}")
        if epoch % 2:
            trainlib.report({"epoch": epoch})
            continue
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "epoch").write_text(str(epoch))
            trainlib.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(directory))


def _fit(
    tmp_path: Path, callback: UserCallback, max_failures: int = 0, **config: Any
) -> trainlib.Result:
    return TorchTrainer(
        _train,
        train_loop_config={"epochs": 3, **config},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="ray-callback",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=max_failures),
            callbacks=[callback],
        ),
    ).fit()


def test_after_report_hears_every_report_with_its_committed_checkpoint(tmp_path: Path) -> None:
    callback = RecordingCallback()
    result = _fit(tmp_path, callback)
    assert callback.reports == [
        ("ray-callback", 1, [{"epoch": 0}], "checkpoint_000000"),
        ("ray-callback", 1, [{"epoch": 1}], None),
        ("ray-callback", 1, [{"epoch": 2}], "checkpoint_000002"),
    ]
    assert callback.exceptions == []  # nothing failed
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000002")


def test_after_exception_hears_each_failed_rank_as_an_exception(tmp_path: Path) -> None:
    callback = RecordingCallback()
    with pytest.raises(WorkerGroupError) as raised:
        _fit(tmp_path, callback, fail_at=1)
    assert [metrics for _, _, metrics, _ in callback.reports] == [[{"epoch": 0}]]
    (told,) = callback.exceptions
    assert list(told) == [0]
    assert isinstance(told[0], RankError)
    assert "ValueError: the loss is NaN at epoch 1" in str(told[0])
    assert told[0].failure == raised.value.failures[0]
    assert raised.value.worker_failures.keys() == told.keys()  # Ray's name, the same errors


def test_after_exception_hears_every_failed_attempt_as_rays(tmp_path: Path) -> None:
    """Ray calls it whenever a poll of the group finds errors: a failure the restart recovers
    is heard once, and a run that fails each of its attempts is heard once per attempt."""
    recovered = RecordingCallback()
    result = _fit(
        tmp_path / "a", recovered, max_failures=1, fail_at=1, fail_once=str(tmp_path / "once")
    )
    assert result.error is None and result.num_restarts == 1
    (told,) = recovered.exceptions
    assert "the loss is NaN at epoch 1" in str(told[0])
    failing = RecordingCallback()
    with pytest.raises(WorkerGroupError) as raised:
        _fit(tmp_path / "b", failing, max_failures=2, fail_at=1)
    assert len(failing.exceptions) == 3  # two attempts restarted, the last raised
    assert failing.exceptions[-1][0].failure == raised.value.failures[0]


def test_ray_paths_and_hierarchy() -> None:
    assert V2UserCallback is UserCallback and V2ControllerError is ControllerError
    assert issubclass(UserCallback, trainlib.Callback)
    # Ray v2: fit() raises TrainingFailedError, a WorkerGroupError or a ControllerError
    assert issubclass(WorkerGroupError, TrainingFailedError)
    assert issubclass(ControllerError, TrainingFailedError)
    assert issubclass(trainlib.NotEnoughWorkersError, ControllerError)


def test_controller_error_names_its_failure() -> None:
    try:
        try:
            raise OSError("the scheduler went away")
        except OSError as cause:
            raise trainlib.ClusterError("cannot reach the cluster") from cause
    except ControllerError as error:
        assert isinstance(error.controller_failure, OSError)
    plain = ControllerError("reports made by rank 0 only")
    assert plain.controller_failure is plain


def _asks_validation_without_a_function(config: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        trainlib.report(
            {"epoch": 0}, checkpoint=Checkpoint.from_directory(directory), validation=True
        )


def test_a_run_that_breaks_the_controllers_rules_raises_controller_error(tmp_path: Path) -> None:
    trainer = TorchTrainer(
        _asks_validation_without_a_function,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="no-validation", storage_path=str(tmp_path)),
    )
    with pytest.raises(ControllerError, match="has no validation function"):
        trainer.fit()

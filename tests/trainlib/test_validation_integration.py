"""Checkpoint validation, as Ray Train's asynchronous validation guide: ``report(validation=)``
has the driver run ``ValidationConfig.fn`` on the committed checkpoint as a Dask task while the
ranks go on training; its metrics join the checkpoint's."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import Client

import trainlib
from trainlib import (
    CheckpointConfig,
    CheckpointConsistencyMode,
    ConfigError,
    ReportedCheckpointStatus,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    ValidationConfig,
    ValidationTaskConfig,
    WorkerGroupError,
)
from trainlib._internal.common.commit_marker import COMMIT_MARKER, CommittedCheckpoint
from trainlib._internal.driver.validation_queue import Validations
from trainlib.torch import TorchTrainer

_WAIT_S = 60.0


def validation_fn(
    checkpoint: trainlib.Checkpoint, train_run_name: str, epoch: int, out: str
) -> dict[str, Any]:
    """Ray's guide's validation function, on a saved tensor: the score is read from the
    checkpoint. The first validation waits until rank 0 has started epoch 2: it can only
    end if training goes on meanwhile."""
    with checkpoint.as_directory() as directory:
        weight = torch.load(os.path.join(directory, "model.pt"), weights_only=True)
    if epoch == 0:
        deadline = time.monotonic() + _WAIT_S
        while not Path(out, "epoch-2-started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # polls a condition (with a deadline); never the synchronisation
    return {
        "score": float(weight.sum()),
        "validated_run": train_run_name,
        "validated_in": os.getpid(),
        "overlapped": Path(out, "epoch-2-started").exists(),
    }


def train_func(config: dict[str, Any]) -> None:
    """Ray's guide's training function: rank 0 reports a checkpoint with a validation task
    config each epoch, the other ranks report nothing."""
    context = trainlib.get_context()
    rank = context.get_world_rank()
    statuses: dict[str, Any] = {}
    for epoch in range(3):
        if rank == 0:
            Path(config["out"], f"epoch-{epoch}-started").touch()
            directory = tempfile.mkdtemp()
            torch.save(torch.full((2,), 10.0 - epoch), os.path.join(directory, "model.pt"))
            trainlib.report(
                {"loss": 1.0 / (epoch + 1), "epoch": epoch, "score": -1.0},
                checkpoint=trainlib.Checkpoint.from_directory(directory),
                checkpoint_upload_mode=trainlib.CheckpointUploadMode.ASYNC,
                validation=ValidationTaskConfig(
                    fn_kwargs={"train_run_name": context.get_experiment_name(), "epoch": epoch}
                ),
            )
        else:
            trainlib.report({}, None)
        if epoch == 1:  # validation 0 waits for epoch 2: it is still pending here
            committed = trainlib.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED)
            statuses["at_epoch_1"] = [r.status.value for r in committed]
    validated = trainlib.get_all_reported_checkpoints()  # VALIDATED: waits for all three
    statuses["at_end"] = [[r.status.value, r.metrics["score"]] for r in validated]
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(statuses))


def _trainer(tmp_path: Path, client: Client, fn: Any = validation_fn, **run: Any) -> TorchTrainer:
    return TorchTrainer(
        train_func,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="validated", storage_path=str(tmp_path / "runs"), **run),
        client=client,
        validation_config=ValidationConfig(
            fn=fn, task_config=ValidationTaskConfig(fn_kwargs={"out": str(tmp_path)})
        ),
    )


def test_checkpoints_are_validated_on_the_cluster_while_training_goes_on(
    dask_client: Client, tmp_path: Path
) -> None:
    result = _trainer(tmp_path, dask_client).fit()

    validated = sorted(result.best_checkpoints, key=lambda pair: pair[1]["epoch"])
    assert [m["score"] for _, m in validated] == [20.0, 18.0, 16.0]  # the validation's, not -1
    assert [m["loss"] for _, m in validated] == [1.0, 0.5, pytest.approx(1 / 3)]  # kept
    assert {m["validated_run"] for _, m in validated} == {"validated"}
    assert validated[0][1]["overlapped"] is True  # validation 0 ended only after epoch 2 began
    assert os.getpid() not in {m["validated_in"] for _, m in validated}  # a Dask task's process
    assert result.metrics["score"] == 16.0  # the last report took its validation's metrics
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["at_epoch_1"][0] == "PENDING_VALIDATION"
        assert seen["at_end"] == [["VALIDATED", 20.0], ["VALIDATED", 18.0], ["VALIDATED", 16.0]]
    marker = json.loads(Path(validated[0][0].path, COMMIT_MARKER).read_text())
    assert marker["validated"] is True and marker["metrics"]["score"] == 20.0
    assert not Path(validated[0][0].path, COMMIT_MARKER + ".new").exists()


def test_num_to_keep_ranks_by_validated_metrics_and_spares_checkpoints_awaiting_validation(
    dask_client: Client, tmp_path: Path
) -> None:
    config = CheckpointConfig(
        num_to_keep=1, checkpoint_score_attribute="score", checkpoint_score_order="max"
    )
    result = _trainer(tmp_path, dask_client, checkpoint_config=config).fit()

    # Reported with score -1, checkpoints 0 and 1 would have been deleted at once; they waited
    # for their validation, then the best validated one (0) and the latest (2) were kept.
    kept = [os.path.basename(c.path) for c, _ in result.best_checkpoints]
    assert kept == ["checkpoint_000000", "checkpoint_000002"]
    assert not (tmp_path / "runs" / "validated" / "checkpoint_000001").exists()
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["at_end"] == [["VALIDATED", 20.0], ["VALIDATED", 16.0]]


def failing_validation(checkpoint: trainlib.Checkpoint, epoch: int, **_: Any) -> Any:
    if epoch == 1:
        raise RuntimeError("validation data unreachable")
    if epoch == 2:
        return [0.5]  # not a dict
    return {"score": 1.0}


def test_a_failing_validation_is_logged_and_the_run_goes_on(
    dask_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="trainlib"):
        result = _trainer(tmp_path, dask_client, fn=failing_validation).fit()

    scores = sorted((m["epoch"], m["score"]) for _, m in result.best_checkpoints)
    assert scores == [(0, 1.0), (1, -1.0), (2, -1.0)]  # the failed ones keep their own
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert [status for status, _ in seen["at_end"]] == ["VALIDATED", "COMMITTED", "COMMITTED"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("checkpoint_000001" in e and "validation data unreachable" in e for e in errors)
    assert any("checkpoint_000002" in e and "must return a dict of metrics" in e for e in errors)


def report_then_fail(config: dict[str, Any]) -> None:
    """One checkpoint asking for validation, then the run fails (no restart)."""
    directory = tempfile.mkdtemp()
    torch.save(torch.ones(2), os.path.join(directory, "model.pt"))
    trainlib.report(
        {"loss": 0.5},
        checkpoint=trainlib.Checkpoint.from_directory(directory),
        validation=ValidationTaskConfig(fn_kwargs={"score": 7}),
    )
    raise RuntimeError("the node went away")


def blocked_validation(checkpoint: trainlib.Checkpoint, out: str, **_: Any) -> dict[str, Any]:
    """Ends only once the test says so (after the run it belongs to has failed)."""
    deadline = time.monotonic() + _WAIT_S
    while not Path(out, "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # polls a condition (with a deadline); never the synchronisation
    return {"score": -100}


def validation_finish(checkpoint: trainlib.Checkpoint, score: int, out: str) -> dict[str, Any]:
    return {"score": score}


def check_validated(config: dict[str, Any]) -> None:
    """Ray's resumption test: the next run of the name sees the validation finished."""
    reported = trainlib.get_all_reported_checkpoints()
    Path(config["out"], "resumed.json").write_text(
        json.dumps([[r.status.value, r.metrics] for r in reported])
    )


def test_a_validation_the_run_left_waiting_is_run_by_the_next_run_of_its_name(
    dask_client: Client, tmp_path: Path
) -> None:
    def trainer(func: Any, fn: Any) -> TorchTrainer:
        return TorchTrainer(
            func,
            train_loop_config={"out": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name="resumed", storage_path=str(tmp_path / "runs")),
            client=dask_client,
            validation_config=ValidationConfig(
                fn=fn, task_config=ValidationTaskConfig(fn_kwargs={"out": str(tmp_path)})
            ),
        )

    with pytest.raises(WorkerGroupError, match="the node went away"):
        trainer(report_then_fail, blocked_validation).fit()
    (tmp_path / "release").touch()  # the first run's validation task ends; its answer is dropped
    marker = tmp_path / "runs" / "resumed" / "checkpoint_000000" / COMMIT_MARKER
    assert json.loads(marker.read_text())["validation"] == {"score": 7}  # still waiting

    result = trainer(check_validated, validation_finish).fit()

    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed == [["VALIDATED", {"loss": 0.5, "score": 7}]]  # the report's own argument
    assert result.best_checkpoints[0][1] == {"loss": 0.5, "score": 7}
    recorded = json.loads(marker.read_text())
    assert recorded["validated"] is True and "validation" not in recorded


class GroupEnded(trainlib.Callback):
    """Marks, in the driver, that the ranks have all ended."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_group_end(self, info: trainlib.GroupInfo) -> None:
        (self.out / "group-ended").touch()


def report_and_return(config: dict[str, Any]) -> None:
    directory = tempfile.mkdtemp()
    torch.save(torch.ones(2), os.path.join(directory, "model.pt"))
    trainlib.report(
        {"loss": 0.5}, checkpoint=trainlib.Checkpoint.from_directory(directory), validation=True
    )


def validation_after_training(checkpoint: trainlib.Checkpoint, out: str) -> dict[str, Any]:
    """Ends only once every rank has ended: fit() has to wait for it."""
    deadline = time.monotonic() + _WAIT_S
    while not Path(out, "group-ended").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # polls a condition (with a deadline); never the synchronisation
    return {"ended_after_training": Path(out, "group-ended").exists()}


def test_fit_waits_for_a_validation_still_running_when_training_ends(
    dask_client: Client, tmp_path: Path
) -> None:
    result = TorchTrainer(
        report_and_return,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name="waited", storage_path=str(tmp_path / "runs"), callbacks=[GroupEnded(tmp_path)]
        ),
        client=dask_client,
        validation_config=ValidationConfig(
            validation_after_training, ValidationTaskConfig({"out": str(tmp_path)})
        ),
    ).fit()
    assert result.metrics == {"loss": 0.5, "ended_after_training": True}


def report_once(config: dict[str, Any]) -> None:
    directory = tempfile.mkdtemp()
    Path(directory, "weights").write_text(str(config["value"]))
    trainlib.report(
        {"value": config["value"]},
        checkpoint=trainlib.Checkpoint.from_directory(directory) if config["save"] else None,
        validation=config["validation"],
    )
    if config["save"]:
        reported = trainlib.get_all_reported_checkpoints()
        Path(config["out"]).write_text(json.dumps(reported[-1].metrics))


def read_weights(checkpoint: trainlib.Checkpoint, scale: int = 1) -> dict[str, Any]:
    with checkpoint.as_directory() as directory:
        return {"read": int(Path(directory, "weights").read_text()) * scale, "pid": os.getpid()}


def _local(tmp_path: Path, validation_config: ValidationConfig | None, **config: Any) -> Any:
    return TorchTrainer(
        report_once,
        train_loop_config={"value": 7, "save": True, "out": str(tmp_path / "seen.json"), **config},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="local", storage_path=str(tmp_path / "runs")),
        validation_config=validation_config,
    ).fit()


def test_local_mode_validates_in_this_process_at_the_report(tmp_path: Path) -> None:
    config = ValidationConfig(read_weights, ValidationTaskConfig({"scale": 2}))
    result = _local(tmp_path, config, validation=ValidationTaskConfig({"scale": 3}))
    assert result.metrics == {"value": 7, "read": 21, "pid": os.getpid()}  # the report's override
    assert json.loads((tmp_path / "seen.json").read_text())["read"] == 21


def test_validation_without_a_validation_config_fails_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError, match=r"validation_config=trainlib.ValidationConfig"):
        _local(tmp_path, None, validation=True)


def test_validation_without_a_checkpoint_fails_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(WorkerGroupError, match=r"pass checkpoint= as well, or validation=False"):
        _local(tmp_path, ValidationConfig(read_weights), validation=True, save=False)


def test_ray_options_without_a_dask_counterpart_are_refused_naming_the_alternative() -> None:
    with pytest.raises(ConfigError, match=r"submit_kwargs="):
        ValidationConfig(read_weights, ray_remote_kwargs={"num_gpus": 1})
    with pytest.raises(ConfigError, match=r"must be a function"):
        ValidationConfig("read_weights")  # type: ignore[arg-type]
    lock = threading.Lock()
    with pytest.raises(ConfigError, match=r"cannot be sent to the Dask workers .*lock"):
        ValidationConfig(lambda checkpoint: {"locked": lock.locked()})
    with pytest.raises(ConfigError, match=r"ValidationConfig\(fn=...\)"):
        TorchTrainer(report_once, validation_config={"fn": read_weights})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"fn_kwargs"):
        ValidationTaskConfig(fn_kwargs=[("epoch", 1)])  # type: ignore[arg-type]
    assert ReportedCheckpointStatus("VALIDATED") is ReportedCheckpointStatus.VALIDATED


def test_a_validation_no_worker_can_run_is_named_in_a_warning(
    dask_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ValidationConfig(read_weights, submit_kwargs={"resources": {"GPUU": 1}})  # a typo
    checkpoint = trainlib.Checkpoint.from_directory(str(tmp_path))
    validations = Validations(config, lambda index, metrics: None)
    validations.use(dask_client)
    with caplog.at_level(logging.WARNING, logger="trainlib"):
        validations.request(CommittedCheckpoint(0, checkpoint, {}, {}), {})
        validations.cancel()  # it would wait for such a worker to join
    [warning] = [r.getMessage() for r in caplog.records if "No Dask worker" in r.getMessage()]
    assert "{'GPUU': 1}" in warning and "--resources" in warning

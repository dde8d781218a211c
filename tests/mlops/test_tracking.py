"""MLflow tracking on a real sqlite store: every epoch is logged exactly once, whatever instant
the driver died at."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import trainlib
from mlops.tracking import GIT_SHA_VARIABLE, MLflowCallback, git_sha, start_run

EPOCHS = 4
KEYS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "epoch_time_s")


def _metrics(epoch: int) -> dict[str, float]:
    # In report order, as the train function reports them; the commit marker stores them sorted.
    return {"epoch": epoch, **{key: 0.1 * epoch + i for i, key in enumerate(KEYS)}}


def _report(epoch: int) -> trainlib.Report:
    return trainlib.Report(epoch, _metrics(epoch), None)


def _info(*committed: trainlib.Report) -> trainlib.RunInfo:
    """The run as it starts, with the reports of the checkpoints already committed."""
    return trainlib.RunInfo(
        "run", "/runs/run", 2, committed[-1] if committed else None, tuple(committed)
    )


def _steps(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    return {key: sorted(m.step for m in client.get_metric_history(run_id, key)) for key in KEYS}


@pytest.mark.parametrize("died_at_epoch", range(EPOCHS))
@pytest.mark.parametrize("keys_logged", range(len(KEYS) + 1))
def test_tracking_logs_each_epoch_once_after_the_driver_died(
    tracking_uri: str, died_at_epoch: int, keys_logged: int
) -> None:
    """The driver committed ``died_at_epoch``'s checkpoint, logged ``keys_logged`` of its
    metrics to MLflow, and died; the run is resumed from that checkpoint."""
    run_id = start_run(tracking_uri, "race", f"r{died_at_epoch}-{keys_logged}", {}, {})
    client = MlflowClient(tracking_uri)
    first = MLflowCallback(tracking_uri, run_id)
    first.on_start(_info())
    for epoch in range(died_at_epoch):
        first.on_report(_report(epoch))
    for key in KEYS[:keys_logged]:  # an MLflow call cut off part-way
        client.log_metric(run_id, key, _metrics(died_at_epoch)[key], step=died_at_epoch)

    resumed = trainlib.Report(died_at_epoch, dict(sorted(_metrics(died_at_epoch).items())), None)
    second = MLflowCallback(tracking_uri, run_id)
    second.on_start(_info(resumed))
    for epoch in range(died_at_epoch + 1, EPOCHS):
        second.on_report(_report(epoch))

    assert _steps(client, run_id) == {key: list(range(EPOCHS)) for key in KEYS}


def test_tracking_epochs_trained_again_after_the_checkpoint_are_not_logged_twice(
    tracking_uri: str,
) -> None:
    """Epochs 1 and 2 reported without checkpoints were logged; the run resumes from epoch 0's
    checkpoint and trains (and reports) them again."""
    run_id = start_run(tracking_uri, "race", "retrained", {}, {})
    first = MLflowCallback(tracking_uri, run_id)
    first.on_start(_info())
    for epoch in range(3):
        first.on_report(_report(epoch))
    second = MLflowCallback(tracking_uri, run_id)
    second.on_start(_info(_report(0)))
    for epoch in range(1, EPOCHS):
        second.on_report(_report(epoch))
    steps = _steps(MlflowClient(tracking_uri), run_id)
    assert steps == {key: list(range(EPOCHS)) for key in KEYS}


def test_tracking_reports_that_never_reached_mlflow_are_logged_from_the_kept_checkpoints(
    tracking_uri: str,
) -> None:
    """The first driver died with reports 0 to 2 still waiting for MLflow (an outage); their
    checkpoints were kept, and the resumed run logs them."""
    run_id = start_run(tracking_uri, "race", "waited", {}, {})
    second = MLflowCallback(tracking_uri, run_id)
    second.on_start(_info(*(_report(epoch) for epoch in range(3))))
    second.on_report(_report(3))
    steps = _steps(MlflowClient(tracking_uri), run_id)
    assert steps == {key: list(range(EPOCHS)) for key in KEYS}


def test_tracking_start_records_the_world_size_that_formed(tracking_uri: str) -> None:
    run_id = start_run(tracking_uri, "race", "world", {}, {"world_size": "4"})
    MLflowCallback(tracking_uri, run_id).on_start(_info())
    assert MlflowClient(tracking_uri).get_run(run_id).data.tags["world_size"] == "2"


def test_tracking_interrupted_run_is_marked_killed(tracking_uri: str, tmp_path: Path) -> None:
    run_id = start_run(tracking_uri, "race", "interrupted", {}, {})
    result = trainlib.Result({}, None, [], str(tmp_path), None, error=KeyboardInterrupt())  # type: ignore[arg-type]
    MLflowCallback(tracking_uri, run_id).on_end(result)
    assert MlflowClient(tracking_uri).get_run(run_id).info.status == "KILLED"


def test_tracking_git_sha_is_the_images_commit_else_the_checkouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkout = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.delenv(GIT_SHA_VARIABLE, raising=False)
    assert git_sha() == checkout  # tests run in a clone
    monkeypatch.setenv(GIT_SHA_VARIABLE, "0123abc")  # what the image's build sets
    assert git_sha() == "0123abc"

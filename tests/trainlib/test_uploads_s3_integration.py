"""Checkpoint uploads to a real S3 server (SeaweedFS) through a test proxy: async uploads keep
the step time, transient errors are retried, permanent ones fail at once."""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import Client

import trainlib
from tests.s3_rig import BUCKET, ProxyScript, SeaweedServer, filesystem, s3_proxy
from trainlib import Checkpoint, CheckpointError, RunConfig, ScalingConfig
from trainlib._internal.common.storage import RunStorage
from trainlib.torch import TorchTrainer


@pytest.fixture
def proxy(checked_s3: SeaweedServer) -> Iterator[tuple[str, ProxyScript]]:
    with s3_proxy(checked_s3.endpoint) as running:
        yield running


def _work(seconds: float) -> None:
    """A training step's compute: matrix products for about ``seconds`` of this rank's CPU."""
    a = torch.randn(128, 128)
    end = time.process_time() + seconds
    while time.process_time() < end:
        a = torch.tanh(a @ a)


def timed_steps(config: dict[str, Any]) -> None:
    """Sync steps, then async ones; a checkpoint every ``every`` steps; rank 0 reports each
    step's time (work + report). One thread: the other core serves the uploads."""
    torch.set_num_threads(1)
    for mode in ("sync", "async"):
        for step in range(config["steps"]):
            started = time.perf_counter()
            _work(config["work_s"])
            checkpoint = None
            if step % config["every"] == 0:
                directory = tempfile.mkdtemp()
                Path(directory, "state.bin").write_bytes(os.urandom(64 * 1024))
                checkpoint = Checkpoint.from_directory(directory)
            trainlib.report(
                {"mode": mode, "step": step, "saved": checkpoint is not None},
                checkpoint=checkpoint,
                checkpoint_upload_mode=mode,  # type: ignore[arg-type]
                delete_local_checkpoint_after_upload=True,
            )
            trainlib.report({"mode": mode, "step_s": time.perf_counter() - started})


def test_uploads_async_keeps_the_step_time_a_slow_storage_adds_to_sync_steps(
    dask_client: Client, proxy: tuple[str, ProxyScript]
) -> None:
    endpoint, script = proxy
    script.put_delay_s = 1.0  # every upload takes at least a second
    config = {"steps": 4, "every": 4, "work_s": 0.5}
    result = TorchTrainer(
        timed_steps,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name="steps",
            storage_path=f"s3://{BUCKET}/{uuid.uuid4().hex}",
            storage_filesystem=filesystem(endpoint),
        ),
        client=dask_client,
    ).fit()
    history = result.metrics_history
    saved = [history[i]["saved"] for i in range(0, len(history), 2)]
    times = [history[i + 1] for i in range(0, len(history), 2)]
    by_kind: dict[tuple[str, bool], list[float]] = {}
    for step_saved, entry in zip(saved, times, strict=True):
        by_kind.setdefault((entry["mode"], step_saved), []).append(entry["step_s"])
    plain = statistics.median(by_kind[("sync", False)] + by_kind[("async", False)])
    assert min(by_kind[("sync", True)]) > plain + 0.8  # the upload is in the step
    assert max(by_kind[("async", True)]) < plain + 0.4  # the upload is not
    assert len(result.best_checkpoints) == 2  # every upload finished and was committed
    storage = RunStorage(result.filesystem, result.path)
    assert all(storage.verify(committed) is None for committed in storage.list_committed())


def save_once(config: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "state.bin").write_bytes(b"weights")
        trainlib.report(
            {"loss": 1.0},
            checkpoint=Checkpoint.from_directory(directory),
            checkpoint_upload_mode=config["mode"],
        )


def test_uploads_survive_503_answers_without_a_restart(
    dask_client: Client, proxy: tuple[str, ProxyScript], caplog: pytest.LogCaptureFixture
) -> None:
    endpoint, script = proxy
    script.put_statuses = [503] * 3  # the checkpoint file's first three PUTs
    caplog.set_level(logging.WARNING, logger="trainlib._retries")
    result = TorchTrainer(
        save_once,
        train_loop_config={"mode": "async"},  # the upload thread's retries (sync: the same)
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name="flaky",
            storage_path=f"s3://{BUCKET}/{uuid.uuid4().hex}",
            storage_filesystem=filesystem(endpoint),
        ),
        client=dask_client,
    ).fit()
    assert [status for _, _, status in script.answered if status == 503] == [503] * 3
    assert result.num_restarts == 0
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert Path(directory, "state.bin").read_bytes() == b"weights"
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 3 and all("upload the checkpoint" in m for m in retries)


def test_uploads_403_fails_at_once_naming_the_path(
    dask_client: Client, proxy: tuple[str, ProxyScript]
) -> None:
    endpoint, script = proxy
    storage_path = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="check the storage credentials") as raised:
        TorchTrainer(
            save_once,
            train_loop_config={"mode": "sync"},
            run_config=RunConfig(
                name="denied",
                storage_path=storage_path,
                storage_filesystem=filesystem(endpoint, secret="not-the-secret"),
            ),
            client=dask_client,
        ).fit()
    assert f"{storage_path}/denied" in str(raised.value)
    assert time.monotonic() - started < 10  # no retries
    requests = [(method, path) for method, path, _ in script.answered]
    assert requests and len(set(requests)) == len(requests)  # none was repeated
    assert all(status == 403 for _, _, status in script.answered)

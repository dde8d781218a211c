"""The ranks' queue on a real cluster: a Dask worker that puts a pickle there (as the queue
carried before, or as a worker that is not ours would) stops the driver's mailbox with one
readable error, after the messages before it, and runs nothing in the driver's process; a run's
numpy and torch metrics reach the driver as JSON data."""

from __future__ import annotations

import pickle
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from distributed import Client, Queue

import trainlib
from trainlib import RunConfig, ScalingConfig, ValidationTaskConfig, WorkerGroupError
from trainlib._internal.common import wire
from trainlib._internal.common.messages import RankStarted
from trainlib._internal.common.waiting import Mailbox
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


class _Planted:
    """Writes a file where it is unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (Path(self.path), "ran"))


def _put_from_worker(queue_name: str, items: list[Any]) -> None:
    queue = Queue(queue_name)
    for item in items:
        queue.put(item)


def test_a_pickle_on_the_ranks_queue_is_refused_and_runs_nothing(
    dask_client: Client, tmp_path: Path
) -> None:
    planted = tmp_path / "planted"
    name = f"trainlib-test-{uuid.uuid4().hex}"
    woke = threading.Event()
    mailbox = Mailbox(Queue(name, client=dask_client), woke.set)
    started = RankStarted(1, "10.0.0.5", 4242)
    items = [wire.encode(started), pickle.dumps(_Planted(str(planted)))]
    try:
        dask_client.submit(_put_from_worker, name, items, pure=False).result(timeout=60)
        taken: list[Any] = []
        error: wire.WireError | None = None
        while error is None:
            woke.clear()
            try:
                got = mailbox.take_all()
            except wire.WireError as exc:
                error = exc
                continue
            taken += got
            if not got:
                assert woke.wait(60), "the mailbox never woke"
        assert taken == [started]
        assert "not one trainlib's ranks send (a bytes, not JSON text" in str(error)
        assert not planted.exists()
    finally:
        mailbox.close()


def numpy_metrics(config: dict[str, Any]) -> None:
    trainlib.report(
        {
            "loss": np.float32(0.5),
            "step": np.int64(2),
            "acc": torch.tensor(0.25),
            "per_class": torch.tensor([1.0, 3.0]),
            "tag": config["tag"],
        }
    )


def test_numpy_and_torch_metrics_reach_the_driver_as_json_data(
    dask_client: Client, tmp_path: Path
) -> None:
    result = TorchTrainer(
        numpy_metrics,
        train_loop_config={"tag": ("a", 1)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="wire", storage_path=str(tmp_path)),
        client=dask_client,
    ).fit()
    assert result.metrics is not None
    names = ("loss", "step", "acc", "per_class", "tag")
    sent = {k: v for k, v in result.metrics.items() if k in names}
    assert sent == {"loss": 0.5, "step": 2, "acc": 0.25, "per_class": [1.0, 3.0], "tag": ["a", 1]}
    assert type(sent["step"]) is int and type(sent["acc"]) is float


def object_for_validation(config: dict[str, Any]) -> None:
    directory = Path(config["dir"], str(trainlib.get_context().get_world_rank()))
    directory.mkdir()
    trainlib.report(
        {"step": 0},
        checkpoint=trainlib.Checkpoint.from_directory(str(directory)),
        validation=ValidationTaskConfig(fn_kwargs={"split": object()}),
    )


def test_a_validation_argument_that_is_no_json_data_fails_the_report_naming_it(
    dask_client: Client, tmp_path: Path
) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        TorchTrainer(
            object_for_validation,
            train_loop_config={"dir": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="wire", storage_path=str(tmp_path / "runs")),
            client=dask_client,
        ).fit()
    root = caught.value.root_cause
    assert root.summary.startswith("TypeError: report(validation=ValidationTaskConfig(fn_kwargs))")
    assert "fn_kwargs))['split'] is a object: it travels to the driver as JSON" in root.traceback

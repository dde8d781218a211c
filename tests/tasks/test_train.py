"""The train step's decisions: run names, tags, which failures are worth a retry."""

from __future__ import annotations

import pytest
from prefect.states import Completed, Failed

from cifar.errors import InvalidParameterError
from cifar.train_loop import TrainConfig
from tasks.train import is_infrastructure_failure, run_tags, training_run_name
from trainlib import RankFailure, WorkerGroupError


def test_train_run_name_is_given_or_one_per_flow_run() -> None:
    assert training_run_name("mine", "flow-1") == "mine"
    assert training_run_name(None, "flow-1") == "train-cifar-flow-1"
    assert training_run_name(None, None).startswith("train-cifar-")


def test_train_run_tags_name_model_world_size_and_device() -> None:
    tags = run_tags(TrainConfig(model="resnet18", use_gpu=True), num_workers=4)
    assert tags == {"model": "resnet18", "world_size": "4", "device": "cuda"}


def test_train_config_refuses_what_cannot_train() -> None:
    with pytest.raises(InvalidParameterError, match="Unknown model 'vgg'"):
        TrainConfig(model="vgg")
    with pytest.raises(InvalidParameterError, match="lr=inf a finite number"):
        TrainConfig(lr=float("inf"))


def _failed(kind: str) -> object:
    failure = RankFailure(1, "host", kind, "boom")  # type: ignore[arg-type]
    return Failed(data=WorkerGroupError({1: failure}))


@pytest.mark.parametrize(
    ("kind", "retried"),
    [
        ("worker_lost", True),
        ("preempted", True),
        ("exit", True),
        ("hang", True),
        ("exception", False),
    ],
)
def test_train_retries_only_after_infrastructure_failures(kind: str, retried: bool) -> None:
    assert is_infrastructure_failure(None, None, _failed(kind)) is retried  # type: ignore[arg-type]
    assert not is_infrastructure_failure(None, None, Failed(data=ValueError("x")))
    assert not is_infrastructure_failure(None, None, Completed())

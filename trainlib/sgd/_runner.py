"""Inside each rank of a PyTorchTrainer: the creators' objects and the command loop.

``serve`` is the live group's training function: it builds models, optimizers, schedulers,
loss and loaders from the creators, restores the run's latest checkpoint if there is one
(a re-formed group), reports once (ready), then answers each command with one report.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from trainlib._internal.common.messages import SHUTDOWN, Command
from trainlib._internal.rank.process_globals import next_command
from trainlib.checkpoint import Checkpoint
from trainlib.context import get_context
from trainlib.reporting import get_checkpoint, report
from trainlib.sgd import functions
from trainlib.sgd.precision import MixedPrecision, set_mixed_precision
from trainlib.torch import get_device, prepare_data_loader, prepare_model

STATE_FILE = "state.pt"
TRAIN, VALIDATE, SAVE_STATE, LOAD_STATE = "train", "validate", "save_state", "load_state"


@dataclass(frozen=True)
class RunnerSetup:
    """The trainer's arguments a rank needs (pickled with the user's functions)."""

    model_creator: Callable[..., Any]
    data_creator: Callable[..., Any]
    optimizer_creator: Callable[..., Any]
    loss_creator: Any
    scheduler_creator: Callable[..., Any] | None
    train_function: Callable[..., dict[str, Any]]
    validation_function: Callable[..., dict[str, Any]]
    config: dict[str, Any]
    batch_size: int  # per rank
    use_fp16: bool
    scheduler_step_freq: Literal["batch", "epoch"]


def serve(setup: RunnerSetup) -> None:
    """Build, restore, report ready, then answer commands until SHUTDOWN."""
    runner = _restored_runner(setup)
    report({"epoch": runner.epoch})
    while (command := next_command()).kind != SHUTDOWN:
        runner.answer(command)


def step_forever(setup: RunnerSetup) -> None:
    """A Tune trial of ``PyTorchTrainable``: build, restore, then one step after another (a
    training pass and a validation pass), each reported with the state as a checkpoint, until
    the Tuner stops the trial (its scheduler's ``max_t``, ``stop`` or pruning)."""
    runner = _restored_runner(setup)
    while True:
        stats = runner.train_pass()
        if runner.val_loader is not None:
            stats.update(runner.validate_pass())
        runner.report_state(stats)


def _restored_runner(setup: RunnerSetup) -> _Runner:
    """The rank's objects, loaded from the run's latest checkpoint if there is one."""
    runner = _Runner(setup)
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        runner.load_state(read_state(checkpoint))
    return runner


def read_state(checkpoint: Checkpoint) -> bytes:
    """The state file of a checkpoint reported by ``SAVE_STATE``."""
    with (
        checkpoint.as_directory() as directory,
        open(os.path.join(directory, STATE_FILE), "rb") as file,
    ):
        return file.read()


def load_state_bytes(data: bytes) -> dict[str, Any]:
    """A state saved by a PyTorchTrainer (tensors and plain values only)."""
    state: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return state


class _Runner:
    """One rank's models, optimizers, schedulers, loss and loaders."""

    def __init__(self, setup: RunnerSetup) -> None:
        self.setup = setup
        config = setup.config
        device = get_device()
        self.precision = MixedPrecision(enabled=setup.use_fp16, device=device)
        set_mixed_precision(self.precision)
        functions.set_scheduler_step_freq(setup.scheduler_step_freq)
        self.models = [m.to(device) for m in _as_tuple(setup.model_creator(config))]
        self.optimizers = _as_tuple(setup.optimizer_creator(_given(self.models), config))
        self.schedulers: tuple[Any, ...] = ()
        if setup.scheduler_creator is not None:
            self.schedulers = _as_tuple(setup.scheduler_creator(_given(self.optimizers), config))
        self.criterion = _criterion(setup.loss_creator, config, device)
        self.wrapped = [prepare_model(m, move_to_device=False) for m in self.models]
        self.train_loader, self.val_loader = _loaders(
            setup.data_creator(setup.batch_size, config), setup.batch_size
        )
        self.epoch = 0

    def answer(self, command: Command) -> None:
        """Run one command and report its answer (every rank reports once)."""
        if command.kind == TRAIN:
            report(self.train_pass())
        elif command.kind == VALIDATE:
            report(self.validate_pass())
        elif command.kind == SAVE_STATE:
            self.report_state({"epoch": self.epoch})
        elif command.kind == LOAD_STATE:
            self.load_state(command.payload)
            report({"epoch": self.epoch})
        else:
            raise ValueError(f"Unknown PyTorchTrainer command {command.kind!r}.")

    def train_pass(self) -> dict[str, Any]:
        """One pass of the train function; its metrics averaged over the ranks, and ``epoch``."""
        stats = self.setup.train_function(
            self.setup.config,
            _given(self.wrapped),
            self.train_loader,
            self.criterion,
            _given(self.optimizers),
            _given(self.schedulers) if self.schedulers else None,
        )
        self.epoch += 1
        return _mean_over_ranks({**_checked(stats, "train_function"), "epoch": self.epoch})

    def validate_pass(self) -> dict[str, Any]:
        """One pass of the validation function; its metrics averaged over the ranks."""
        if self.val_loader is None:
            raise ValueError(
                "validate() needs validation data: make data_creator return "
                "(train, validation) loaders or datasets."
            )
        stats = self.setup.validation_function(
            self.setup.config,
            _given(self.wrapped),
            self.val_loader,
            self.criterion,
            _given(self.schedulers) if self.schedulers else None,
        )
        return _mean_over_ranks(_checked(stats, "validation_function"))

    def report_state(self, metrics: dict[str, Any]) -> None:
        """Report ``metrics``: rank 0 with the state as a checkpoint, the others without."""
        if get_context().get_world_rank() != 0:
            report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:
            torch.save(self.state(), os.path.join(directory, STATE_FILE))
            report(metrics, checkpoint=Checkpoint.from_directory(directory))

    def state(self) -> dict[str, Any]:
        """Everything to resume from: unwrapped models, optimizers, schedulers, scaler."""
        return {
            "epoch": self.epoch,
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "scaler": self.precision.scaler.state_dict(),
        }

    def load_state(self, data: bytes) -> None:
        """Load a state saved by ``state()`` (a trainer built from the same creators)."""
        state = load_state_bytes(data)
        for model, saved in zip(self.models, state["models"], strict=True):
            model.load_state_dict(saved)
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
        if self.schedulers and state["schedulers"]:  # a trainer without one ignores them
            for scheduler, saved in zip(self.schedulers, state["schedulers"], strict=True):
                scheduler.load_state_dict(saved)
        if state["scaler"] and self.precision.scaler.is_enabled():
            self.precision.scaler.load_state_dict(state["scaler"])
        self.epoch = int(state["epoch"])
        set_epoch = getattr(getattr(self.train_loader, "sampler", None), "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self.epoch)  # the next pass shuffles as the saved trainer's would have


def _as_tuple(created: Any) -> tuple[Any, ...]:
    return tuple(created) if isinstance(created, (tuple, list)) else (created,)


def _given(items: Any) -> Any:
    """What the user's functions get: the one object, or a tuple of several."""
    items = tuple(items)
    return items[0] if len(items) == 1 else items


def _criterion(loss_creator: Any, config: dict[str, Any], device: torch.device) -> Any:
    if loss_creator is None:
        return None
    if isinstance(loss_creator, type) and issubclass(loss_creator, nn.Module):
        criterion = loss_creator()
    else:
        criterion = loss_creator(config)
    return criterion.to(device) if isinstance(criterion, nn.Module) else criterion


def _loaders(created: Any, batch_size: int) -> tuple[Any, Any]:
    """The train and validation loaders from what data_creator returned, sharded per rank."""
    items = _as_tuple(created)
    if len(items) not in (1, 2):
        raise ValueError(
            f"data_creator returned {len(items)} items; return a train loader or dataset, or "
            "a (train, validation) pair."
        )
    train = _loader(items[0], batch_size, shuffle=True)
    validation = _loader(items[1], batch_size, shuffle=False) if len(items) == 2 else None
    return train, validation


def _loader(data: Any, batch_size: int, shuffle: bool) -> Any:
    if data is None:
        return None
    if not isinstance(data, DataLoader):
        data = DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    return prepare_data_loader(data)


def _checked(stats: Any, name: str) -> dict[str, Any]:
    if not isinstance(stats, dict) or not all(isinstance(k, str) for k in stats):
        raise TypeError(f"The {name} must return a dict of metrics keyed by str, got {stats!r}.")
    return stats


def _mean_over_ranks(stats: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's stats with every number averaged over the ranks (NaNs ignored)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return stats
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, stats)
    merged = dict(stats)
    for key, value in stats.items():
        values = [other.get(key) for other in gathered]
        numbers = [v for v in values if _is_number(v) and not math.isnan(v)]
        if _is_number(value) and any(v != value for v in values):
            merged[key] = sum(numbers) / len(numbers) if numbers else math.nan
    return merged


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

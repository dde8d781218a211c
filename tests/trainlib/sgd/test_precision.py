"""MixedPrecision on the CPU: bfloat16 autocast when enabled, plain float32 otherwise."""

from __future__ import annotations

import math

import pytest
import torch

from trainlib._internal.rank.process_globals import RANK
from trainlib.sgd import MixedPrecision, functions, get_mixed_precision


def _step(precision: MixedPrecision) -> tuple[torch.dtype, bool]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    with precision.autocast():
        output = model(torch.randn(8, 4))
        loss = torch.nn.functional.mse_loss(output.float(), torch.zeros(8, 1))
    optimizer.zero_grad()
    precision.backward(loss)
    precision.step(optimizer)
    return output.dtype, not torch.equal(before, model.weight)


def test_precision_enabled_on_cpu_uses_bfloat16_without_scaling() -> None:
    precision = MixedPrecision(enabled=True, device=torch.device("cpu"))
    assert _step(precision) == (torch.bfloat16, True)
    assert not precision.scaler.is_enabled()


def test_precision_disabled_is_plain_float32() -> None:
    assert _step(MixedPrecision(enabled=False, device=torch.device("cpu"))) == (
        torch.float32,
        True,
    )


def test_get_mixed_precision_outside_a_rank_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match="inside the train_function"):
        get_mixed_precision()


def test_precision_gives_the_loss_a_float32_output_and_leaves_other_values() -> None:
    precision = MixedPrecision(enabled=True, device=torch.device("cpu"))
    assert precision.to_float(torch.zeros(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert precision.to_float(torch.zeros(2, dtype=torch.long)).dtype == torch.long
    assert precision.to_float("not a tensor") == "not a tensor"


def _scaled_cpu_precision() -> MixedPrecision:
    """float16 semantics on the CPU: a GradScaler that skips steps with inf gradients."""
    precision = MixedPrecision(enabled=True, device=torch.device("cpu"))
    precision.scaler = torch.amp.GradScaler("cpu", enabled=True)
    return precision


def test_precision_step_says_when_the_scaler_skipped_it() -> None:
    precision = _scaled_cpu_precision()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    precision.backward(model(torch.tensor([[math.inf, 1.0]])).sum())
    assert precision.step(optimizer) is False
    assert torch.equal(before, model.weight)
    optimizer.zero_grad()
    precision.backward(model(torch.ones(1, 2)).sum())
    assert precision.step(optimizer) is True
    assert not torch.equal(before, model.weight)


def test_precision_train_epoch_computes_the_loss_in_float32_and_skips_the_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RANK, "mixed_precision", _scaled_cpu_precision())
    monkeypatch.setattr(RANK, "scheduler_step_freq", "batch")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    seen: list[torch.dtype] = []

    def bce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.append(output.dtype)
        return torch.nn.functional.binary_cross_entropy(torch.sigmoid(output), target)

    batches = [
        (torch.tensor([[math.inf, 1.0]]), torch.ones(1, 1)),  # inf gradients: skipped
        (torch.ones(1, 2), torch.ones(1, 1)),
    ]
    functions.train_epoch({}, model, batches, bce, optimizer, scheduler)  # type: ignore[arg-type]
    assert seen == [torch.float32, torch.float32]
    assert scheduler.last_epoch == 1  # stepped after the second batch only

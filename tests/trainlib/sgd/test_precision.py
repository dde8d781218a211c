"""MixedPrecision on the CPU: bfloat16 autocast when enabled, plain float32 otherwise."""

from __future__ import annotations

import pytest
import torch

from trainlib.sgd import MixedPrecision, get_mixed_precision


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

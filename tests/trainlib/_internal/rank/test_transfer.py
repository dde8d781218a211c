"""move_to_device: every tensor of a batch moves, whatever holds it; the structure stays."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from trainlib._internal.rank.transfer import move_to_device

META = torch.device("meta")  # a device every host has


class Batch(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor


def test_transfer_moves_a_tuple_from_a_collate_fn() -> None:
    x, y = move_to_device((torch.zeros(2), torch.ones(2)), META)
    assert (x.device.type, y.device.type) == ("meta", "meta")


def test_transfer_keeps_a_named_tuple_named() -> None:
    moved = move_to_device(Batch(torch.zeros(2, 3), torch.arange(2)), META)
    assert isinstance(moved, Batch)
    assert (moved.images.device.type, moved.labels.device.type) == ("meta", "meta")
    assert moved.images.shape == (2, 3)


def test_transfer_moves_nested_mappings_and_lists_and_leaves_other_values() -> None:
    moved = move_to_device({"x": [torch.zeros(1), 3], "name": "a"}, META)
    assert moved["x"][0].device.type == "meta"
    assert moved["x"][1] == 3 and moved["name"] == "a"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_transfer_stager_copies_on_a_side_stream_and_keeps_values() -> None:
    from trainlib._internal.rank.transfer import DeviceStager

    device = torch.device("cuda", 0)
    stager = DeviceStager(device)
    staged = [
        stager.stage({"x": torch.full((4, 3), float(i)), "y": (torch.arange(4),)}) for i in range(3)
    ]
    batches = [stager.ready(s) for s in staged]
    assert [b["x"].device for b in batches] == [device] * 3
    assert [float(b["x"].sum()) for b in batches] == [0.0, 12.0, 24.0]
    assert batches[2]["y"][0].tolist() == [0, 1, 2, 3]

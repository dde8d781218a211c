from __future__ import annotations

import torch

from cifar.augment import augment, augmentation_generator, random_crop, random_flip


def test_augment_crop_shifts_each_image_within_padding() -> None:
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).reshape(2, 3, 8, 8)
    cropped = random_crop(images, padding=2, generator=torch.Generator().manual_seed(0))
    assert cropped.shape == images.shape and cropped.dtype == torch.uint8
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    for n in range(2):
        windows = [padded[n, :, y : y + 8, x : x + 8] for y in range(5) for x in range(5)]
        assert any(torch.equal(cropped[n], w) for w in windows)


def test_augment_flip_mirrors_some_images_only() -> None:
    images = torch.rand(64, 3, 4, 4)
    flipped = random_flip(images, generator=torch.Generator().manual_seed(0))
    mirrored = [torch.equal(f, i.flip(2)) for f, i in zip(flipped, images, strict=True)]
    unchanged = [torch.equal(f, i) for f, i in zip(flipped, images, strict=True)]
    assert all(m or u for m, u in zip(mirrored, unchanged, strict=True))
    assert 10 < sum(mirrored) < 54


def _augmented(seed: int, rank: int, epoch: int) -> torch.Tensor:
    images = torch.arange(16 * 3 * 8 * 8, dtype=torch.float32).reshape(16, 3, 8, 8)
    generator = augmentation_generator(seed, rank, epoch, torch.device("cpu"))
    return torch.stack([augment(images, generator) for _ in range(3)])  # three steps


def test_augment_each_rank_draws_its_own_crops_and_flips_reproducibly() -> None:
    rank0, rank1 = _augmented(seed=7, rank=0, epoch=2), _augmented(seed=7, rank=1, epoch=2)
    assert not torch.equal(rank0, rank1)  # one stream for all ranks augmented them alike
    assert torch.equal(rank0, _augmented(seed=7, rank=0, epoch=2))  # the epoch run again
    assert not torch.equal(rank0, _augmented(seed=7, rank=0, epoch=3))
    assert not torch.equal(rank0, _augmented(seed=8, rank=0, epoch=2))


def test_augment_the_stream_ignores_the_global_seed() -> None:
    torch.manual_seed(0)
    first = _augmented(seed=1, rank=0, epoch=0)
    torch.manual_seed(123)
    assert torch.equal(first, _augmented(seed=1, rank=0, epoch=0))

from __future__ import annotations

import torch

from cifar.augment import random_crop, random_flip


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

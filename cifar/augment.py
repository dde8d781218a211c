"""Batched data augmentation as tensor ops, run on the training device."""

from __future__ import annotations

import numpy as np
import torch


def random_crop(
    images: torch.Tensor, padding: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Pad every image by ``padding`` (zeros) and crop it back at a random offset."""
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    device = generator.device if generator is not None else images.device  # no host copy
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    dy, dx = dy.to(images.device), dx.to(images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device)[None, :])[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=images.device)[None, :])[:, None, None, :]
    batch = torch.arange(n, device=images.device)[:, None, None, None]
    channels = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
    return padded[batch, channels, rows, cols]


def random_flip(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip a random half of the images horizontally."""
    device = generator.device if generator is not None else images.device
    flip = torch.rand(images.shape[0], generator=generator, device=device).to(images.device) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(3), images)


def augment(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """CIFAR's standard augmentation: random crop with 4-pixel padding, horizontal flip."""
    return random_flip(random_crop(images, padding=4, generator=generator), generator=generator)


def augmentation_generator(
    seed: int, rank: int, epoch: int, device: torch.device
) -> torch.Generator:
    """The random stream of one rank's augmentation in one epoch, on ``device``.

    Each rank draws its own crops and flips (with one stream for all, every rank would crop
    and flip its images alike at every step), and an epoch run again (a run resumed from the
    checkpoint before it) draws the same ones.
    """
    state = np.random.SeedSequence([seed, rank, epoch]).generate_state(1, dtype=np.uint64)
    return torch.Generator(device=device).manual_seed(int(state[0]))

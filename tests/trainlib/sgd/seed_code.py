"""Seed 002's RaySGD snippets ("Distributed PyTorch", RaySGD PyTorchTrainer) with
``ray.util.sgd`` -> ``trainlib.sgd``, tiny sizes, imported by the ranks.

The guide shows the creator signatures but not their bodies (they live in an example file it
includes): those bodies, the GAN networks, ``inception_score`` and ``latent_vector_size`` are
filled in here, marked ``# filled:``. Two changes to the seed's code are marked ``# fixed:``.
Functions copied from the guide keep its text.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import Dataset, TensorDataset

# filled: the guide's DCGAN works on images; 8x8 single-channel ones here
latent_vector_size = 4
IMAGE_SIZE = 8


# --- the creator example (loss_creator=nn.MSELoss) ------------------------------------------


def model_creator(config: dict[str, Any]) -> nn.Module:
    # filled: a linear regression model
    return nn.Linear(1, 1)


def optimizer_creator(model: nn.Module, config: dict[str, Any]) -> optim.Optimizer:
    # filled
    return optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))


def scheduler_creator(optimizer: optim.Optimizer, config: dict[str, Any]) -> Any:
    # filled
    return optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)


class LinearData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """filled: y = 2x + 5 with noise. When ``kill_flag`` exists, the rank that reads item 0
    removes it and SIGKILLs its own process (the rank death of the fault tolerance test)."""

    def __init__(self, size: int, kill_flag: str | None = None) -> None:
        generator = torch.Generator().manual_seed(size)
        self.x = torch.randn(size, 1, generator=generator)
        self.y = 2 * self.x + 5 + 0.01 * torch.randn(size, 1, generator=generator)
        self.kill_flag = kill_flag

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kill_flag and os.path.exists(self.kill_flag):
            try:
                os.remove(self.kill_flag)  # one death only: the re-formed group reads on
            except FileNotFoundError:
                pass  # the other rank took it
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.x[index], self.y[index]


def data_creator(batch_size: int, config: dict[str, Any]) -> tuple[Dataset[Any], Dataset[Any]]:
    # filled: train and validation datasets; and a mark that the initialization hook ran
    # in this rank process before this creator
    if "out_dir" in config:
        mark = f"data-creator-{os.getpid()}-{os.environ.get('NCCL_DEBUG')}"
        open(os.path.join(config["out_dir"], mark), "x").close()
    return LinearData(64, config.get("kill_flag")), LinearData(32)


def initialization_hook(runner: Any) -> None:
    print("NCCL DEBUG SET")
    # Need this for avoiding a connection restart issue
    os.environ["NCCL_SOCKET_IFNAME"] = "^docker0,lo"
    os.environ["NCCL_LL_THRESHOLD"] = "0"
    os.environ["NCCL_DEBUG"] = "INFO"


# --- the multi-model (DCGAN) example ----------------------------------------------------------


class Discriminator(nn.Module):
    """filled: a tiny DCGAN discriminator for 8x8 images."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 4, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2),
            nn.Conv2d(4, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


class Generator(nn.Module):
    """filled: a tiny DCGAN generator of 8x8 images."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(latent_vector_size, 4, 4, 1, 0, bias=False),
            nn.ReLU(True),
            nn.ConvTranspose2d(4, 1, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def weights_init(m: nn.Module) -> None:
    # filled: DCGAN's initialisation
    if "Conv" in type(m).__name__:
        nn.init.normal_(m.weight.data, 0.0, 0.02)


def inception_score(fake: torch.Tensor) -> tuple[float, float]:
    # filled: a stand-in (no Inception network offline)
    return float(fake.std()), 0.0


def gan_data_creator(batch_size: int, config: dict[str, Any]) -> tuple[Dataset[Any], Dataset[Any]]:
    # filled: random "real" images, the same on every rank and in every run
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(32, 1, IMAGE_SIZE, IMAGE_SIZE, generator=generator) * 2 - 1
    return TensorDataset(images, torch.zeros(32)), TensorDataset(images[:8], torch.zeros(8))


def gan_model_creator(config: dict[str, Any]) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)  # filled: the weights and the training's noise are seeded: one outcome
    netD = Discriminator()
    netD.apply(weights_init)

    netG = Generator()
    netG.apply(weights_init)
    return netD, netG


def gan_optimizer_creator(models: Any, config: dict[str, Any]) -> tuple[Any, Any]:
    net_d, net_g = models
    discriminator_opt = optim.Adam(
        net_d.parameters(), lr=config.get("lr", 0.01), betas=(0.5, 0.999)
    )
    generator_opt = optim.Adam(net_g.parameters(), lr=config.get("lr", 0.01), betas=(0.5, 0.999))
    return discriminator_opt, generator_opt


def train(config, model, train_iterator, criterion, optimizer, scheduler=None):
    """Runs one standard training pass over the train_iterator.

    (The guide's custom training function: the DCGAN step.)
    """
    models, optimizers, dataloader = model, optimizer, train_iterator  # fixed: the guide's
    # body names its arguments models, optimizers and dataloader
    netD, netG = models
    optimD, optimG = optimizers
    real_label = 1.0  # fixed: 1 makes an integer label tensor, which BCELoss refuses
    fake_label = 0
    device = next(netD.parameters()).device  # fixed: the rank's device, not any GPU the host has

    for i, data in enumerate(dataloader, 0):  # noqa: B007 (the guide's code)
        netD.zero_grad()
        real_cpu = data[0].to(device)
        b_size = real_cpu.size(0)
        label = torch.full((b_size,), real_label, device=device)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()

        noise = torch.randn(b_size, latent_vector_size, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimD.step()

        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        optimG.step()

        is_score, is_std = inception_score(fake)  # noqa: RUF059 (the guide's code)

    return {"loss_g": errG.item(), "loss_d": errD.item(), "inception": is_score}


def custom_validate(config, model, val_iterator, criterion, scheduler=None):
    """Runs one standard validation pass over the val_iterator."""
    # filled: the guide's "...": the discriminator's loss on the real images and as many of
    # the generator's (as in train: 2 ln 2 at chance), and how often it rates a real image
    # above a generated one (0.5 at chance)
    netD, netG = model
    loss = correct = total = 0.0
    with torch.no_grad():
        for real, _ in val_iterator:
            fake = netG(torch.randn(real.size(0), latent_vector_size, 1, 1))
            on_real, on_fake = netD(real).view(-1), netD(fake).view(-1)
            errD = criterion(on_real, torch.ones_like(on_real)) + criterion(
                on_fake, torch.zeros_like(on_fake)
            )
            loss += float(errD) * real.size(0)
            correct += float((on_real > on_fake).sum())
            total += real.size(0)
    return {"validation_loss_d": loss / total, "validation_accuracy": correct / total}

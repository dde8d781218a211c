"""The plain DDP script benchmarks/epoch_throughput.py measures trainlib against, run by
``torchrun --standalone --nproc_per_node=N``: the same model, augmentation, optimizer, global
batch, per-epoch validation and checkpoint as train-cifar's training, the Parquet files read
into memory first.

Run by epoch_throughput.py: torchrun ... plain_ddp.py DATASET_URI --out FILE [--model M]
    [--epochs N] [--gpu] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

GLOBAL_BATCH = 256


def plain_main(dataset_uri: str, options: argparse.Namespace, out: str) -> None:
    """Rank 0 writes its epoch durations and CPU samples to ``out``.

    On a GPU: NCCL, the data in GPU memory, bf16 autocast (fp16 where bf16 is missing, with
    loss scaling), channels_last, and ``torch.compile`` with ``--compile``: what the
    pipeline's training function does.
    """
    import torch
    import torch.distributed as dist
    from torch import nn

    from cifar.augment import augment
    from cifar.dataset import Dataset, read_manifest, read_split
    from cifar.models import ModelSpec

    gpu = options.gpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = read_manifest(dataset_uri)
    assert manifest is not None
    dataset = Dataset(dataset_uri, manifest)
    train, val = read_split(dataset, "train"), read_split(dataset, "val")
    images, labels = torch.from_numpy(train.images).to(device), torch.from_numpy(train.labels)
    labels = labels.to(device)
    val_images = torch.from_numpy(val.images).to(device)
    val_labels = torch.from_numpy(val.labels).to(device)
    per_rank = GLOBAL_BATCH // world
    steps = (len(labels) // world) // per_rank
    torch.manual_seed(0)
    classifier = ModelSpec(options.model, manifest.mean, manifest.std).build().to(device)
    memory_format = torch.channels_last if gpu else torch.contiguous_format
    classifier = classifier.to(memory_format=memory_format)
    model: nn.Module = nn.parallel.DistributedDataParallel(classifier) if world > 1 else classifier
    if options.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    dtype = None
    if gpu:
        native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        dtype = torch.bfloat16 if native_bf16 else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.05, total_steps=options.epochs * steps
    )
    ends, cpu = [], []
    for epoch in range(options.epochs):
        model.train()
        generator = torch.Generator().manual_seed(epoch)
        mine = torch.randperm(len(labels), generator=generator)[rank::world].to(device)
        totals = torch.zeros(3, dtype=torch.float64, device=device)
        for step in range(steps):
            rows = mine[step * per_rank : (step + 1) * per_rank]
            batch = augment(images[rows]).contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(batch)
            loss = nn.functional.cross_entropy(logits.float(), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            totals += _totals(loss.detach() * len(rows), logits, labels[rows])
        dist.all_reduce(totals)
        model.eval()
        evaluation = torch.zeros(3, dtype=torch.float64, device=device)
        with torch.no_grad():
            share = len(val_labels) // world  # equal shares: DDP's forward is a collective
            for start in range(rank * share, (rank + 1) * share, 1024):
                stop = min(start + 1024, (rank + 1) * share)
                chunk = val_images[start:stop].contiguous(memory_format=memory_format)
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    logits = model(chunk)
                target = val_labels[start:stop]
                loss_sum = nn.functional.cross_entropy(logits.float(), target, reduction="sum")
                evaluation += _totals(loss_sum, logits, target)
        dist.all_reduce(evaluation)
        float(totals[0] + evaluation[0])  # the epoch's figures reach the host, as in the pipeline
        if rank == 0:
            state = {
                "model": classifier.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": epoch,
            }
            torch.save(state, os.path.join(os.path.dirname(out), f"checkpoint-{epoch}.pt"))
        dist.barrier()
        ends.append(time.monotonic())
        if rank == 0:
            cpu.append(tree_cpu(os.getppid()))  # torchrun's agent and its ranks
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"durations": list(np.diff(ends)), "cpu": cpu}, f)
    dist.barrier()
    dist.destroy_process_group()


def _totals(loss_sum: Any, logits: Any, labels: Any) -> Any:
    import torch

    correct = (logits.argmax(1) == labels).sum()
    seen = torch.full((), len(labels), device=labels.device)  # a fill, not a host copy
    return torch.stack([loss_sum.double(), correct.double(), seen.double()])


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of ``root`` and every process under it, by pid."""
    import psutil

    seconds: dict[str, float] = {}
    top = psutil.Process(root)
    for process in [top, *top.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[str(process.pid)] = times.user + times.system
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset_uri")
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="one rank on GPU 0, bf16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    plain_main(args.dataset_uri, args, args.out)


if __name__ == "__main__":
    main()

"""The training loop's GPU settings: inputs in channels_last, autocast to bfloat16 (float16 with
loss scaling on GPUs without it), and what they did, measured on the model (``took_effect``);
on CPU each is a no-op."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn


def model_inputs(images: torch.Tensor, use_gpu: bool) -> torch.Tensor:
    """Images in the model's memory format (channels_last on GPU)."""
    if use_gpu:
        return images.contiguous(memory_format=torch.channels_last)
    return images


def took_effect(classifier: nn.Module, use_gpu: bool) -> dict[str, float]:
    """What the GPU settings did, measured on the model (reported with each epoch, so a test
    or a reader of the run sees the mechanism, not only the accuracy): its weights in
    channels_last, and the dtype its forward pass gives under the loop's autocast."""
    first = next(p for p in classifier.parameters() if p.dim() == 4)  # the first convolution
    probe = model_inputs(torch.zeros(2, 3, 32, 32, device=first.device), use_gpu)
    with torch.no_grad(), autocast(autocast_dtype(use_gpu)):
        dtype = classifier.eval()(probe).dtype
    classifier.train()
    return {
        "channels_last": float(first.is_contiguous(memory_format=torch.channels_last)),
        "autocast_bf16": float(dtype is torch.bfloat16),
        "autocast_fp16": float(dtype is torch.float16),
    }


def compiled_graphs() -> float:
    """How many graphs torch.compile made in this process so far (0: nothing was compiled)."""
    from torch._dynamo.utils import counters

    return float(counters["stats"]["unique_graphs"])


def autocast_dtype(use_gpu: bool) -> torch.dtype | None:
    """bfloat16 on GPUs that have it, float16 (with loss scaling) on older ones, else None."""
    if not use_gpu:
        return None
    native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if native_bf16 else torch.float16


def autocast(dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype)

"""``ray.train.v2.api.train_fn_utils``: what a training function calls."""

from trainlib import (
    get_all_reported_checkpoints,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    get_preemption_info,
    report,
)

__all__ = [
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]

"""Seed 001's converted training loop ("Converting an existing training loop", Ray AIR) runs on
trainlib with only the imports swapped.

SEED_001 is the guide's final code: the training function after both diffs, then the
``TorchTrainer`` it builds and ``fit()``. The guide leaves the model, the dataset, the loop
body and the batch size to the reader (``...``); they are filled in here, marked ``# filled:``,
tiny. The test swaps ``ray.air`` for ``trainlib.air`` and ``ray.train`` for ``trainlib``
(``from ray import train`` becomes ``import trainlib as train``) and runs the script as a user
would, with ``python script.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import rank_processes, run_script_for_result

REPOSITORY = Path(__file__).resolve().parents[2]

SEED_001 = """
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from ray.air import session
from ray import train
import ray.train.torch

# filled: a model, a dataset with signal (y = x·w exactly) and a per-worker batch size
from torch.utils.data import TensorDataset
NeuralNetwork = lambda: torch.nn.Linear(4, 1)
features = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
my_dataset = TensorDataset(features, features @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
worker_batch_size = 8


def train_func():
    # Create model.
    model = NeuralNetwork()

    model = train.torch.prepare_model(model)

    # filled: an optimizer and a loss for the loop body, and the losses it sees
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    losses = []

    data_loader = DataLoader(my_dataset, batch_size=worker_batch_size)
    data_loader = train.torch.prepare_data_loader(data_loader)

    for X, y in data_loader:
        # filled: the loop body
        loss = loss_fn(model(X), y)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    global_batch_size = worker_batch_size * session.get_world_size()
    # filled: what the run tells the driver
    session.report(
        {
            "loss": loss.item(),
            "first_loss": losses[0],
            "steps": len(losses),
            "global_batch_size": global_batch_size,
            "world_rank": session.get_world_rank(),
            "local_rank": session.get_local_rank(),
            "is_ddp": isinstance(model, DistributedDataParallel),
        }
    )


from ray.air import ScalingConfig
from ray.train.torch import TorchTrainer
# For GPU Training, set `use_gpu` to True.
use_gpu = False
trainer = TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(use_gpu=use_gpu, num_workers=2)
)

result = trainer.fit()
"""

PRINT_RESULT = '\nimport json\nprint("RESULT", json.dumps(result.metrics))\n'


def swap_imports(source: str) -> str:
    """What a user porting from Ray AIR changes."""
    source = source.replace("from ray import train", "import trainlib as train")
    return source.replace("ray.air", "trainlib.air").replace("ray.train", "trainlib")


def test_air_seed_loop_runs_with_imports_swapped(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(swap_imports(SEED_001) + PRINT_RESULT)
    # HOME: the run directory goes to the default storage path, ~/trainlib_results;
    # PYTHONPATH: this checkout's trainlib, wherever the package is installed from
    environment = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPOSITORY)}
    metrics = run_script_for_result(script, cwd=tmp_path, env=environment)
    assert metrics["global_batch_size"] == 16
    assert metrics["world_rank"] == 0
    assert metrics["local_rank"] == 0
    assert metrics["is_ddp"] is True
    # every rank's share of the 256 rows, 8 at a time: 16 steps, over which the loss falls
    # from about the targets' variance (14) to a small fraction of it
    assert metrics["steps"] == 256 // 2 // 8
    assert metrics["loss"] < metrics["first_loss"] / 10
    assert list((tmp_path / "trainlib_results").iterdir())
    assert rank_processes() == []

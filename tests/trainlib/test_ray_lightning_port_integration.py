"""Ray Train's "Get Started with PyTorch Lightning" runs on trainlib with only the imports swapped.

RAY_LIGHTNING_GUIDE is the guide's "PyTorch Lightning + Ray Train" code
(doc/source/train/getting-started-pytorch-lightning.rst), as written there but for the sizes (2
epochs instead of 10, on CPUs) and the download (FashionMNIST's shape from torchvision's
``FakeData`` instead of FashionMNIST, which cannot be downloaded here). The test swaps
``ray.train`` for ``trainlib`` and runs it as a user would, then reloads the checkpoint with
Lightning's own ``load_from_checkpoint``.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_script_for_result, trainlib_processes
from tests.trainlib.tune.test_ray_tune_port_integration import swap_imports

RAY_LIGHTNING_GUIDE = """
import torch
from torchvision.models import resnet18
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor, Normalize, Compose
from torch.utils.data import DataLoader
import pytorch_lightning as pl

from ray.train.torch import TorchTrainer
from ray.train import ScalingConfig
import ray.train.lightning

# Model, Loss, Optimizer
class ImageClassifier(pl.LightningModule):
    def __init__(self):
        super(ImageClassifier, self).__init__()
        self.model = resnet18(num_classes=10)
        self.model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        outputs = self.forward(x)
        loss = self.criterion(outputs, y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=0.001)


def train_func(config):

    # Data
    transform = Compose([ToTensor(), Normalize((0.5,), (0.5,))])
    train_data = FashionMNIST(root='./data', train=True, download=True, transform=transform)
    train_dataloader = DataLoader(train_data, batch_size=128, shuffle=True)

    # Training
    model = ImageClassifier()
    # [1] Configure PyTorch Lightning Trainer.
    trainer = pl.Trainer(
        max_epochs=10,
        devices="auto",
        accelerator="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[ray.train.lightning.RayTrainReportCallback()],
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=train_dataloader)

# [2] Configure scaling and resource requirements.
scaling_config = ScalingConfig(num_workers=2, use_gpu=True)

# [3] Launch distributed training job.
trainer = TorchTrainer(train_func, scaling_config=scaling_config)
result = trainer.fit()
"""

SIZES = {
    "max_epochs=10": "max_epochs=2",
    "use_gpu=True": "use_gpu=False",
    # 512 images in FashionMNIST's shape (1x28x28, 10 classes): 2 batches a rank an epoch
    "FashionMNIST(root='./data', train=True, download=True, transform=transform)": (
        "FakeData(size=512, image_size=(1, 28, 28), num_classes=10, transform=transform)"
    ),
    "from torchvision.datasets import FashionMNIST": "from torchvision.datasets import FakeData",
}

RELOAD_AND_PRINT = """
import json
import os

with result.checkpoint.as_directory() as checkpoint_dir:
    path = os.path.join(checkpoint_dir, ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME)
    reloaded = ImageClassifier.load_from_checkpoint(path)
    logits = reloaded(torch.zeros(2, 1, 28, 28))
print("RESULT", json.dumps({
    "epochs": [m["epoch"] for m in result.metrics_history],
    "steps": [m["step"] for m in result.metrics_history],
    "loss": result.metrics["loss"],
    "logits": list(logits.shape),
}))
"""


def test_ray_lightning_guide_runs_with_imports_swapped(tmp_path: Path) -> None:
    """Both ranks train one model: Lightning's sampler gives each half of the data (2 steps an
    epoch, not 4), each epoch's checkpoint reloads with ``load_from_checkpoint``."""
    before = {p.pid for p in trainlib_processes()}
    source = RAY_LIGHTNING_GUIDE
    for ray_line, sized in SIZES.items():
        assert ray_line in source
        source = source.replace(ray_line, sized)
    script = tmp_path / "lightning_guide.py"
    script.write_text(swap_imports(source + RELOAD_AND_PRINT))
    result = run_script_for_result(script, cwd=tmp_path)
    assert result["epochs"] == [0, 1]
    assert result["steps"] == [2, 4]  # 512 images / (2 ranks x 128) a step
    assert isinstance(result["loss"], float)
    assert result["logits"] == [2, 10]
    assert {p.pid for p in trainlib_processes()} <= before

"""Ray Train's "Get Started with Hugging Face Transformers" runs on trainlib with the imports
swapped.

RAY_TRANSFORMERS_GUIDE is the guide's "Hugging Face Transformers + Ray Train" code
(doc/source/train/getting-started-transformers.rst) with what this offline CPU machine needs
marked ``# offline:``: a tiny BERT made from its config instead of ``bert-base-cased`` (no
download), pre-tokenized reviews in ``yelp_review_full``'s shape with learnable labels instead of
``load_dataset``, accuracy computed with NumPy instead of ``evaluate.load``, 2 CPU ranks. The
training function, the callback, ``prepare_trainer`` and the reload from the checkpoint are the
guide's. A second script gives the Trainer a Ray Data shard's ``iter_torch_batches()``, as Ray's
Transformers-with-Ray-Data example does.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_script_for_result, trainlib_processes
from tests.trainlib.tune.test_ray_tune_port_integration import swap_imports

RAY_TRANSFORMERS_GUIDE = """
import os
import sys

import numpy as np
import torch
from transformers import (
    BertConfig,  # offline: a tiny BERT from its config instead of AutoModel...from_pretrained
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

import ray.train.huggingface.transformers
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

TINY_BERT = BertConfig(  # offline
    vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=64, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)


class TokenizedReviews(torch.utils.data.Dataset):  # offline: yelp_review_full, tokenized
    def __init__(self, size, seed):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 5, (size,), generator=generator)
        self.input_ids = torch.randint(10, 64, (size, 12), generator=generator)
        self.input_ids[:, 1:] = (self.labels + 1)[:, None]  # learnable: the tokens name the stars

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": torch.ones(12, dtype=torch.long),
                "labels": self.labels[i]}


# [1] Encapsulate data preprocessing, training, and evaluation
# logic in a training function
# ============================================================
def train_func():
    # Datasets
    small_train_dataset = TokenizedReviews(96, seed=0)  # offline: 100 rows of yelp_review_full
    small_eval_dataset = TokenizedReviews(32, seed=1)

    # Model
    model = BertForSequenceClassification(TINY_BERT)  # offline: from_pretrained("bert-base-cased")

    # Evaluation Metrics
    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        predictions = np.argmax(logits, axis=-1)
        return {"accuracy": float((predictions == labels).mean())}  # offline: evaluate's

    # Hugging Face Trainer
    training_args = TrainingArguments(
        output_dir="test_trainer",
        eval_strategy="epoch",
        save_strategy="epoch",
        report_to="none",
        num_train_epochs=3,  # offline: sizes for 2 CPU ranks
        per_device_train_batch_size=8,
        learning_rate=2e-2,
    )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=small_train_dataset,
        eval_dataset=small_eval_dataset,
        compute_metrics=compute_metrics,
    )

    # [2] Report Metrics and Checkpoints to Ray Train
    # ===============================================
    callback = ray.train.huggingface.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)

    # [3] Prepare Transformers Trainer
    # ================================
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)

    # Start Training
    trainer.train()


# [4] Define a Ray TorchTrainer to launch `train_func` on all workers
# ===================================================================
ray_trainer = TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False),  # offline: CPUs
    run_config=RunConfig(storage_path=sys.argv[1]),  # offline: a temporary storage path
)
result: ray.train.Result = ray_trainer.fit()

# [5] Load the trained model.
with result.checkpoint.as_directory() as checkpoint_dir:
    checkpoint_path = os.path.join(
        checkpoint_dir,
        ray.train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME,
    )
    model = BertForSequenceClassification.from_pretrained(checkpoint_path)
"""

PRINT_RESULT = """
import json
reviews = TokenizedReviews(32, seed=1)
with torch.no_grad():
    logits = model(input_ids=reviews.input_ids).logits
print("RESULT", json.dumps({
    "epochs": [m.get("epoch") for m in result.metrics_history],
    "eval_accuracy": [m.get("eval_accuracy") for m in result.metrics_history],
    "checkpoint": os.path.basename(result.checkpoint.path),
    "reloaded_accuracy": float((logits.argmax(-1) == reviews.labels).float().mean()),
}))
"""

RAY_DATA_SHARDS = """
import sys

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import ray.data
import ray.train
import ray.train.huggingface.transformers
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

rows = []
for i in range(64):
    label = i % 5
    rows.append({"input_ids": np.array([2, label + 1, 7, 9], dtype=np.int64), "labels": label})
train_ds = ray.data.from_items(rows)


def train_func():
    shard = ray.train.get_dataset_shard("train")
    model = BertForSequenceClassification(BertConfig(
        vocab_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=5,
    ))
    args = TrainingArguments(output_dir="shards_trainer", max_steps=8, save_steps=4,
                             save_strategy="steps", logging_steps=4, report_to="none")
    trainer = Trainer(model=model, args=args,
                      train_dataset=shard.iter_torch_batches(batch_size=8))
    trainer.add_callback(ray.train.huggingface.transformers.RayTrainReportCallback())
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)
    trainer.train()


result = TorchTrainer(
    train_func,
    datasets={"train": train_ds},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(storage_path=sys.argv[1]),
).fit()
import json
print("RESULT", json.dumps({
    "steps": [m.get("step") for m in result.metrics_history],
    "losses": [m.get("loss") for m in result.metrics_history],
    "files": sorted(os.listdir(os.path.join(result.checkpoint.path, "checkpoint"))),
}))
"""


def test_ray_transformers_guide_runs_with_imports_swapped(tmp_path: Path) -> None:
    """Both ranks train one model (Transformers' sampler halves each epoch between them); each
    epoch's evaluation and checkpoint reach trainlib; the last checkpoint reloads with
    ``from_pretrained`` and classifies the reviews it learned."""
    before = {p.pid for p in trainlib_processes()}
    script = tmp_path / "transformers_guide.py"
    script.write_text(swap_imports(RAY_TRANSFORMERS_GUIDE + PRINT_RESULT))
    result = run_script_for_result(script, str(tmp_path / "results"), cwd=tmp_path)
    assert result["epochs"] == [1.0, 2.0, 3.0]
    assert result["checkpoint"] == "checkpoint_000002"
    # Untrained: one class of five (about 0.2); 0.81-0.91 after 3 epochs in one process
    # (calibrated with 6 seeds), 1.0 on two ranks here.
    assert result["eval_accuracy"][-1] > 0.6
    assert result["reloaded_accuracy"] == result["eval_accuracy"][-1]
    assert {p.pid for p in trainlib_processes()} <= before


def test_transformers_trainer_reads_a_ray_data_shard(tmp_path: Path) -> None:
    """``prepare_trainer`` hands the shard's batches to the Trainer as they come: 8 steps of
    this rank's batches, a report every 4 with the checkpoint rank 0 saved."""
    script = tmp_path / "shards.py"
    source = RAY_DATA_SHARDS.replace("ray.data", "trainlib.data")
    script.write_text("import os\n" + swap_imports(source))
    result = run_script_for_result(script, str(tmp_path / "results"), cwd=tmp_path)
    # 32 rows a rank in batches of 8: 4 steps a pass, so max_steps=8 is two passes
    assert result["steps"] == [4, 8]
    assert all(isinstance(loss, float) for loss in result["losses"])
    assert {"model.safetensors", "config.json", "trainer_state.json"} <= set(result["files"])

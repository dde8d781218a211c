"""The registered classifier as MLflow's pyfunc serves it: a model from code, never a pickle.

MLflow stores this file with each version (``mlflow.pyfunc.log_model(python_model=<this
file>)``) beside the classifier file (``cifar.checkpoint``: weights and what rebuilds them) and
the ``cifar`` package (``code_paths``); ``mlflow.pyfunc.load_model`` and ``mlflow models serve``
run it, and it reads the weights with ``torch.load(..., weights_only=True)``. It imports only
what a serving process has: MLflow, torch, numpy and the carried ``cifar``. The pipeline itself
loads versions without it (``mlops.model_loading``).
"""

from typing import Any

import numpy as np
import torch
from mlflow.models import set_model
from mlflow.pyfunc.model import PythonModel, PythonModelContext

from cifar.classifier_file import ARTIFACT_KEY, read_classifier


class ClassifierModel(PythonModel):
    """uint8 images (N, 3, 32, 32) in, class scores (N, 10) out."""

    def load_context(self, context: PythonModelContext) -> None:
        self._model = read_classifier(context.artifacts[ARTIFACT_KEY])

    def predict(
        self, context: PythonModelContext, model_input: Any, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        with torch.no_grad():
            scores = self._model(torch.from_numpy(np.asarray(model_input, dtype=np.uint8)))
        return scores.numpy()


set_model(ClassifierModel())

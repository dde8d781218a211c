"""The classifier file: what the registry keeps of a published version (``classifier.pt``).

The weights and what rebuilds them (model name, normalisation), read with ``torch.load(...,
weights_only=True)`` into the installed package's classes: plain tensors and Python values
only, never pickled code. It imports torch and ``cifar.models`` alone, so a service that loads
a version from the registry needs nothing of the project but the ``cifar`` package the version
carries (``mlops/pyfunc_model.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from cifar.models import Classifier, ModelSpec

CLASSIFIER_FILE = "classifier.pt"
ARTIFACT_KEY = "weights"  # its key among a registered version's artifacts


def save_classifier(path: str, model: Classifier) -> None:
    """Write ``model``'s weights and spec to the classifier file ``path``."""
    torch.save({"model": model.state_dict(), "model_spec": spec_values(model.spec)}, path)


def read_classifier(path: str) -> Classifier:
    """The classifier in the classifier file ``path`` (``save_classifier``), in eval mode."""
    return classifier_from(torch.load(path, weights_only=True, map_location="cpu"))


def spec_values(spec: ModelSpec) -> dict[str, Any]:
    """``spec`` as plain values, as the files keep it."""
    return {"name": spec.name, "mean": list(spec.mean), "std": list(spec.std)}


def classifier_from(state: dict[str, Any]) -> Classifier:
    """The classifier a file's contents (``model`` weights, ``model_spec``) describe, in eval
    mode."""
    spec = state["model_spec"]
    model = ModelSpec(spec["name"], tuple(spec["mean"]), tuple(spec["std"])).build()
    model.load_state_dict(state["model"])
    return model.eval()

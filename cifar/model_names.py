"""The names of the models the pipeline trains: a light module (no torch) for the commands'
``--model`` choices and for checking a name before anything starts. ``cifar.models`` builds
them."""

from __future__ import annotations

from cifar.errors import InvalidParameterError

MODEL_NAMES = ("small_cnn", "resnet18")


def check_model_name(name: str) -> None:
    """Raise an InvalidParameterError naming the choices if ``name`` is not a known model."""
    if name not in MODEL_NAMES:
        raise InvalidParameterError(
            f"Unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)} (model)."
        )

from __future__ import annotations

import pytest
import torch

from cifar.models import build_model


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_models_take_uint8_images_and_give_ten_scores(name: str) -> None:
    model = build_model(name, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)).eval()
    with torch.no_grad():
        scores = model(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8))
    assert scores.shape == (2, 10) and scores.dtype == torch.float32


def test_models_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="Unknown model 'vit'; choose one of small_cnn, resnet18"):
        build_model("vit", (0.5,) * 3, (0.2,) * 3)


def test_the_light_list_of_model_names_is_the_list_of_backbones() -> None:
    from cifar.model_names import MODEL_NAMES
    from cifar.models import BACKBONES

    assert tuple(BACKBONES) == MODEL_NAMES

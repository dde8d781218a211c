"""``tune.with_resources``: Ray's per-trial resources in Dask's terms, or a clear refusal."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from trainlib import ConfigError, tune
from trainlib.tune.resources import scaling_for


def _trial(config: dict[str, Any]) -> None:
    pass


def test_resources_gpu_and_named_resources_choose_the_trials_worker() -> None:
    scaling = scaling_for({"cpu": 4, "gpu": 1, "accelerator_type:A100": 1})
    assert (scaling.num_workers, scaling.use_gpu) == (1, True)
    assert scaling.resources_per_worker == {"accelerator_type:A100": 1}
    assert scaling_for({"cpu": 2}).resources_per_worker is None


def test_resources_wrapped_trainable_keeps_its_signature() -> None:
    wrapped = tune.with_resources(_trial, {"cpu": 1})
    assert inspect.signature(wrapped) == inspect.signature(_trial)
    assert wrapped.__name__ == "_trial"


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"gpu": 2}, r"at most one GPU; for more, tune a TorchTrainer"),
        ({"cpu": 1, "memory": 2e9}, r"dask worker --memory-limit"),
        (lambda config: {"cpu": 1}, r"must be a dict such as"),
    ],
)
def test_resources_without_a_dask_counterpart_are_refused_naming_the_alternative(
    resources: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        tune.with_resources(_trial, resources)


@pytest.mark.parametrize(
    ("given", "needed"),
    [  # Ray's spellings, as its docs pass them
        ({"CPU": 2, "GPU": 1}, {"cpu": 2, "gpu": 1}),
        (tune.PlacementGroupFactory([{"CPU": 1, "GPU": 1}]), {"cpu": 1, "gpu": 1}),
        (  # a head bundle and its workers' bundles: one trial needs their sum
            tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 2}, {"CPU": 2, "fast_disk": 1}]),
            {"cpu": 5, "fast_disk": 1},
        ),
        (tune.PlacementGroupFactory([{}, {"CPU": 3}]), {"cpu": 3}),
    ],
)
def test_resources_in_rays_names_and_placement_groups_need_the_same(
    given: Any, needed: dict[str, float]
) -> None:
    wrapped = tune.with_resources(_trial, given)
    assert wrapped.resources == needed
    assert wrapped.scaling.use_gpu is (needed.get("gpu") == 1)
    custom = {k: v for k, v in needed.items() if k not in ("cpu", "gpu")}
    assert wrapped.scaling.resources_per_worker == (custom or None)


def test_placement_group_factory_as_ray_describes_it() -> None:
    factory = tune.PlacementGroupFactory([{}, {"CPU": 2, "GPU": 1}], strategy="PACK")
    assert factory.head_bundle_is_empty
    assert factory.required_resources == {"CPU": 2, "GPU": 1}
    assert factory.bundles == [{}, {"CPU": 2, "GPU": 1}]
    with pytest.raises(ConfigError, match="at most one GPU"):  # two GPUs over two bundles
        tune.with_resources(_trial, tune.PlacementGroupFactory([{"GPU": 1}, {"GPU": 1}]))
    with pytest.raises(ConfigError, match="non-empty list of dicts"):
        tune.PlacementGroupFactory([])

from __future__ import annotations

import re

import numpy as np
import pytest

from trainlib import (
    CheckpointConfig,
    ConfigError,
    DaskConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)
from trainlib.data import ExecutionOptions


def test_scaling_config_takes_zero_workers_as_local_mode_only_as_a_whole_size() -> None:
    assert ScalingConfig(num_workers=0).worker_range == (0, 0)
    for invalid in (-1, (0, 2)):
        with pytest.raises(ConfigError, match=r"must be at least 1 \(or 0: local mode\)"):
            ScalingConfig(num_workers=invalid)


def test_scaling_config_rejects_non_positive_resources() -> None:
    with pytest.raises(ConfigError, match="'GPU': 0"):
        ScalingConfig(num_workers=1, resources_per_worker={"GPU": 0})


def test_checkpoint_config_rejects_bad_order() -> None:
    with pytest.raises(ConfigError, match="'max' or 'min'"):
        CheckpointConfig(checkpoint_score_order="best")  # type: ignore[arg-type]


def test_checkpoint_config_rejects_zero_to_keep() -> None:
    with pytest.raises(ConfigError, match="num_to_keep=0"):
        CheckpointConfig(num_to_keep=0)


def test_failure_config_accepts_unlimited_and_rejects_below() -> None:
    assert FailureConfig(max_failures=-1).max_failures == -1
    with pytest.raises(ConfigError, match="max_failures=-2"):
        FailureConfig(max_failures=-2)


@pytest.mark.parametrize("name", ["a/b", "", ".", "..", "/", "../x"])
def test_run_config_rejects_a_name_that_is_not_a_folder_of_storage_path(name: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("without '/', and not '.' or '..'")):
        RunConfig(name=name)
    assert RunConfig(name="...").name == "..."  # a folder name like any other


def test_run_config_storage_path_none_is_the_default_as_in_ray() -> None:
    assert RunConfig().storage_path is None and RunConfig(storage_path=None).storage_path is None
    assert RunConfig().storage == "~/trainlib_results"
    assert RunConfig(storage_path="s3://bucket/runs").storage == "s3://bucket/runs"
    with pytest.raises(ConfigError, match=r"RunConfig\(storage_path=''\) must name a directory"):
        RunConfig(storage_path="")


def test_torch_config_rejects_unknown_backend() -> None:
    with pytest.raises(ConfigError, match="'gloo', 'nccl' or None"):
        TorchConfig(backend="mpi")  # type: ignore[arg-type]


def test_dask_config_rejects_address_and_cluster_class() -> None:
    with pytest.raises(ConfigError, match="not both"):
        DaskConfig(address="tcp://127.0.0.1:8786", cluster_class="dask_jobqueue.SLURMCluster")


def test_configs_are_keyword_only_and_frozen() -> None:
    config = ScalingConfig(num_workers=2)
    with pytest.raises(TypeError):
        ScalingConfig(2)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.num_workers = 3  # type: ignore[misc]


def test_scaling_config_refuses_what_is_not_a_count_and_keeps_a_search_for_a_tuner() -> None:
    from trainlib import tune
    from trainlib.torch import TorchTrainer

    for bad in ("2", (1, 2, 3), 2.0, True):
        with pytest.raises(ConfigError, match="must be an int or a \\(min, max\\) pair"):
            ScalingConfig(num_workers=bad)  # type: ignore[arg-type]
    assert ScalingConfig(num_workers=np.int64(2)).worker_range == (2, 2)
    searched = ScalingConfig(
        num_workers=tune.grid_search([1, 2]),  # type: ignore[arg-type]
        resources_per_worker={"CPU": tune.grid_search([1, 2]), "disk": 1},  # type: ignore[dict-item]
    )
    assert set(searched.searched) == {"num_workers", "resources_per_worker"}
    assert set(searched.searched["resources_per_worker"]) == {"CPU"}
    assert ScalingConfig(num_workers=2).searched == {}
    with pytest.raises(ConfigError, match="a search over trial sizes goes in a Tuner"):
        TorchTrainer(lambda: None, scaling_config=searched)


def test_scaling_config_elastic_range() -> None:
    assert ScalingConfig(num_workers=(1, 3)).worker_range == (1, 3)
    assert ScalingConfig(num_workers=2).worker_range == (2, 2)
    with pytest.raises(ConfigError, match=r"1 <= min <= max"):
        ScalingConfig(num_workers=(3, 2))


def test_scaling_config_rejects_a_worker_setup_that_is_not_a_function() -> None:
    with pytest.raises(ConfigError, match="worker_setup"):
        ScalingConfig(worker_setup="export NCCL_DEBUG=INFO")  # type: ignore[arg-type]


def test_data_config_refuses_what_it_would_ignore_naming_the_alternative() -> None:
    class Custom(DataConfig):
        def configure(self, *args: object, **kwargs: object) -> list[object]:
            return []

    with pytest.raises(ConfigError, match=r"Custom.configure\(\) would be ignored.*map_partitions"):
        Custom()


def test_data_config_takes_rays_execution_options_as_hints_naming_what_dask_ignores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    defaults = DataConfig.default_ingest_options()
    assert defaults.locality_with_output is True and defaults.preserve_order is False
    with caplog.at_level("WARNING", logger="trainlib.data_config"):
        DataConfig(execution_options=defaults)
        assert caplog.messages == []  # Ray's defaults: nothing Dask leaves undone
        options = DataConfig.default_ingest_options()  # Ray's page, as written there
        options.resource_limits.object_store_memory = 10e9
        options.preserve_order = True
        config = DataConfig(execution_options=options)
    assert config.execution_options is options
    (warning,) = caplog.messages
    assert "resource_limits {'object_store_memory': 10000000000.0}" in warning
    assert "--memory-limit" in warning and "preserve_order" not in warning
    caplog.clear()
    train = DataConfig.default_ingest_options()
    train.resource_limits = train.resource_limits.copy(cpu=4, gpu=2)  # Ray's newer form
    with caplog.at_level("WARNING", logger="trainlib.data_config"):
        DataConfig(execution_options={"train": train, "test": ExecutionOptions()})
    assert "execution_options['train'].resource_limits" in caplog.messages[0]
    assert "'test'" not in caplog.messages[0]
    with pytest.raises(TypeError, match="takes ExecutionOptions"):
        DataConfig(execution_options={"locality_with_output": True})  # type: ignore[dict-item]
    assert DataConfig(execution_options=None).execution_options is None

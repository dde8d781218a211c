"""What a flow run's parameters may name: the operator's run policy, which a run cannot change.

Whoever may start a run chooses its parameters, and the worker's credentials (S3 keys, MLflow's
training account, ``PGPASSWORD``, Prefect's auth string) are in the worker's environment. So
every parameter that names a place or a server is checked, before anything is read or written,
against the policy of the worker that runs it: a TOML file named by ``$CIFAR_RUN_POLICY`` in the
worker's environment (which a run cannot override: ``deployments/work-pool.json``), e.g.::

    read = ["https://", "s3://cifar/data/"]   # data_url, predict's input
    write = ["s3://cifar/data/"]              # storage_path, predict's output
    mlflow_tracking_uri = []                  # servers besides the worker's own
    study_storage = []                        #   ($MLFLOW_TRACKING_URI, $CIFAR_STUDY_STORAGE,
    dask_address = []                         #    $DASK_SCHEDULER_ADDRESS)
    dask_cluster_classes = ["distributed.LocalCluster", "dask_jobqueue.*"]
    allow_link_local = false                  # 169.254.0.0/16, fe80::/10: cloud metadata
    registered_models = ["cifar10-classifier"]  # models runs publish to and predict from
    model_aliases = ["champion", "challenger"]  # aliases predict-cifar may load

    [dask_cluster_kwargs]                     # the cluster arguments a run may set, typed
    n_workers = "int"
    memory_limit = "int|str"

``read`` and ``write`` hold URL prefixes: a scheme alone (``"https://"``) allows all of it; a
local path or ``file://`` URL allows that folder, links resolved. A key left out allows nothing
beyond the worker's own servers (``dask_cluster_classes``, ``dask_cluster_kwargs``,
``registered_models`` and ``model_aliases``: the defaults below). ``dask_cluster_kwargs`` is an
allowlist of argument names, each with its type (``int``, ``float``, ``bool``, ``str``,
``list[str]`` or ``place``, a folder checked against ``write``; ``|`` between alternatives): no
other argument reaches a cluster's constructor (``flows.clusters``).

Without ``$CIFAR_RUN_POLICY`` (a user's own command line, ``make run``) every place, server and
model is allowed except link-local addresses; the default cluster classes and arguments apply.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from flows.places import (
    PolicyError,
    covers,
    link_local_address,
    place,
    same_server,
    shown,
)
from mlops.registry import DEFAULT_MODEL_NAME, SYNTHETIC_SUFFIX
from mlops.version_tags import CHALLENGER, CHAMPION

POLICY_VARIABLE = "CIFAR_RUN_POLICY"
DEFAULT_CLUSTER_CLASSES = (
    "distributed.LocalCluster",
    "dask_jobqueue.*",
    "dask_kubernetes.*",
    "dask_cuda.LocalCUDACluster",
)
# The cluster arguments a run may set where a policy file does not list them: sizes, counts and
# places of Dask's LocalCluster, dask-jobqueue's and dask-cuda's clusters. Nothing that names
# code, a command, an environment, Dask's configuration, a plugin, an image or security settings.
DEFAULT_CLUSTER_KWARGS: Mapping[str, str] = {
    "n_workers": "int",
    "threads_per_worker": "int",
    "memory_limit": "int|str",
    "processes": "int|bool",  # LocalCluster's is a bool, dask-jobqueue's a count
    "cores": "int",
    "memory": "str",
    "walltime": "str",
    "queue": "str",
    "account": "str",
    "interface": "str",
    "job_cpu": "int",
    "job_mem": "str",
    "local_directory": "place",
    "log_directory": "place",
    "device_memory_limit": "int|str",
    "CUDA_VISIBLE_DEVICES": "str",
}
# Without a policy file (a user's own command line) also the lists SLURM's GPU jobs take:
# #SBATCH lines and `dask worker` options, which could set an environment or a preload, so a
# worker that runs others' runs allows them only where its policy lists them.
OWN_CLUSTER_KWARGS: Mapping[str, str] = {
    **DEFAULT_CLUSTER_KWARGS,
    "job_extra_directives": "list[str]",
    "worker_extra_args": "list[str]",
}
# The models a run may publish to and predict from by default: the pipeline's own.
DEFAULT_REGISTERED_MODELS = (DEFAULT_MODEL_NAME, DEFAULT_MODEL_NAME + SYNTHETIC_SUFFIX)
DEFAULT_MODEL_ALIASES = (CHAMPION, CHALLENGER)
KWARG_TYPES = frozenset({"int", "float", "bool", "str", "place", "list[str]"})
# parameter -> what it names: a place read, a place written, or a server (and the worker's own)
READ, WRITE = "read", "write"
SERVERS = {
    "mlflow_tracking_uri": "MLFLOW_TRACKING_URI",
    "study_storage": "CIFAR_STUDY_STORAGE",
    "dask_address": "DASK_SCHEDULER_ADDRESS",
}
PLACES = {
    "data_url": READ,
    "predict_input": READ,
    "input": READ,
    "storage_path": WRITE,
    "output": WRITE,
}
MODELS = {"registered_model_name": "registered_models", "alias": "model_aliases"}
_KEYS = frozenset(
    {READ, WRITE, "dask_cluster_classes", "dask_cluster_kwargs", "allow_link_local", *SERVERS}
    | set(MODELS.values())
)


@dataclass(frozen=True)
class RunPolicy:
    """The places and servers a flow run's parameters may name on this worker.

    ``source`` is the policy file (None: no policy, a user's own command line).
    """

    source: str | None = None
    read: tuple[str, ...] | None = None  # None: anything
    write: tuple[str, ...] | None = None
    servers: Mapping[str, tuple[str, ...]] | None = None  # None: any server
    dask_cluster_classes: tuple[str, ...] = DEFAULT_CLUSTER_CLASSES
    dask_cluster_kwargs: Mapping[str, str] = field(default_factory=lambda: OWN_CLUSTER_KWARGS)
    allow_link_local: bool = False
    registered_models: tuple[str, ...] | None = None  # None: any
    model_aliases: tuple[str, ...] | None = None

    def confine(self, **parameters: str | None) -> None:
        """Check each given parameter (None: left out, the worker's default) by its name.

        Raises:
            PolicyError: The first value the policy refuses, naming the policy and the fix.
        """
        for name, value in parameters.items():
            if value is None:
                continue
            if name in SERVERS:
                self._check_server(name, value)
            elif name in PLACES:
                self.check_place(name, value, PLACES[name])
            elif name in MODELS:
                self._check_model(name, value)
            else:
                raise KeyError(f"{name} is not a parameter the run policy knows")

    def check_cluster_class(self, cluster_class: str) -> None:
        """Refuse a Dask cluster class the operator did not allow."""
        if not any(_class_matches(entry, cluster_class) for entry in self.dask_cluster_classes):
            allowed = ", ".join(self.dask_cluster_classes) or "none"
            raise PolicyError(
                f"dask_cluster_class {cluster_class!r} is not allowed here; allowed: {allowed}. "
                f"An operator allows another class by adding it to dask_cluster_classes in "
                f"{self._where()}."
            )

    def check_place(self, name: str, value: str, kind: str) -> None:
        """Refuse ``value`` (parameter ``name``) where runs may not ``kind`` (read or write)."""
        allowed = self.read if kind == READ else self.write
        self._check_link_local(name, value)
        if allowed is None:
            return
        target = place(name, value)
        if not any(covers(place(kind, entry), target) for entry in allowed):
            listed = ", ".join(allowed) or "nothing"
            raise PolicyError(
                f"{name} {shown(value)!r} is not allowed by the run policy ({self.source}): "
                f"runs may {kind} {listed}. Use a place under one of those, or an operator "
                f"adds a prefix to `{kind}` in that file on the worker."
            )

    def _check_model(self, name: str, value: str) -> None:
        allowed: tuple[str, ...] | None = getattr(self, MODELS[name])
        if allowed is None or value in allowed:
            return
        raise PolicyError(
            f"{name} {value!r} is not allowed by the run policy ({self.source}): runs may use "
            f"{', '.join(allowed) or 'none'}. Name one of those, or an operator adds it to "
            f"`{MODELS[name]}` in that file on the worker."
        )

    def _check_server(self, name: str, value: str) -> None:
        self._check_link_local(name, value)
        if self.servers is None:
            return
        own = os.environ.get(SERVERS[name])
        if own is not None and same_server(own, value):
            return
        listed = self.servers.get(name, ())
        if any(covers(place(name, entry), place(name, value)) for entry in listed):
            return
        allowed = ", ".join(([shown(own)] if own else []) + [shown(e) for e in listed])
        raise PolicyError(
            f"{name} {shown(value)!r} is not allowed by the run policy ({self.source}): runs "
            f"may use {allowed or 'no server but the default'}. Leave the parameter out to use "
            f"the worker's own, or an operator adds the server to `{name}` in that file on the "
            "worker."
        )

    def _check_link_local(self, name: str, value: str) -> None:
        if self.allow_link_local:
            return
        if (address := link_local_address(value)) is not None:
            raise PolicyError(
                f"{name} {shown(value)!r} names a link-local address ({address}), where cloud "
                f"metadata services give out the machine's credentials; runs may not reach it. "
                f"An operator allows it with allow_link_local = true in {self._where()}."
            )

    def _where(self) -> str:
        if self.source is None:
            return f"a run policy file named by ${POLICY_VARIABLE} on the worker"
        return f"the run policy ({self.source}) on the worker"


def run_policy() -> RunPolicy:
    """This worker's policy: the file ``$CIFAR_RUN_POLICY`` names, or none (anything allowed
    but link-local addresses).

    Raises:
        PolicyError: The file cannot be read or is not a valid policy (no run starts without it).
    """
    source = os.environ.get(POLICY_VARIABLE)
    if not source:
        return RunPolicy()
    try:
        settings = tomllib.loads(Path(source).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise PolicyError(
            f"The run policy {source} (${POLICY_VARIABLE}) cannot be read ({error}); no run starts "
            "without it. The worker's operator fixes the file or the variable."
        ) from None
    return _parsed(source, settings)


def _parsed(source: str, settings: dict[str, Any]) -> RunPolicy:
    if unknown := sorted(set(settings) - _KEYS):
        raise PolicyError(
            f"The run policy {source} has unknown keys: {', '.join(unknown)}; it knows "
            f"{', '.join(sorted(_KEYS))}. The worker's operator corrects the file."
        )

    def strings(key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = settings.get(key, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise PolicyError(
                f"The run policy {source}: `{key}` must be a list of strings, not {value!r}. "
                "The worker's operator corrects the file."
            )
        return tuple(value)

    link_local = settings.get("allow_link_local", False)
    if not isinstance(link_local, bool):
        raise PolicyError(
            f"The run policy {source}: `allow_link_local` must be true or false, not "
            f"{link_local!r}. The worker's operator corrects the file."
        )
    return RunPolicy(
        source=source,
        read=strings(READ),
        write=strings(WRITE),
        servers={name: strings(name) for name in SERVERS},
        dask_cluster_classes=strings("dask_cluster_classes", DEFAULT_CLUSTER_CLASSES),
        dask_cluster_kwargs=_kwarg_types(source, settings),
        allow_link_local=link_local,
        registered_models=strings("registered_models", DEFAULT_REGISTERED_MODELS),
        model_aliases=strings("model_aliases", DEFAULT_MODEL_ALIASES),
    )


def _kwarg_types(source: str, settings: dict[str, Any]) -> dict[str, str]:
    table = settings.get("dask_cluster_kwargs", DEFAULT_CLUSTER_KWARGS)
    if not isinstance(table, Mapping) or not all(
        isinstance(kind, str) and set(kind.split("|")) <= KWARG_TYPES for kind in table.values()
    ):
        raise PolicyError(
            f"The run policy {source}: `dask_cluster_kwargs` must be a table of argument names "
            f"and their types ({', '.join(sorted(KWARG_TYPES))}, '|' between alternatives), "
            f"not {table!r}. The worker's operator corrects the file."
        )
    return dict(table)


def _class_matches(entry: str, name: str) -> bool:
    return name.startswith(entry[:-1]) if entry.endswith(".*") else name == entry

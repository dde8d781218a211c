"""Which flow run a training run's name belongs to: a ``run_name`` resumes only its own work.

Naming a run again resumes it from its latest checkpoint and continues its MLflow run: the way to
retry a failed night. Unchecked, whoever may start a run could also write into another run's
checkpoints (a live one, or a finished one, with other data or parameters). So the first flow
run to train under a name records itself (``{storage_path}/owners/{run name}.json``: its flow
run id and the fingerprint of its data and parameters), and another flow run may use the name
only to resume it: the owner has ended without completing (Failed, Crashed or Cancelled), and
the data and parameters are the same (a run whose process died is marked Crashed by the
stack's sentinel within minutes). A retry of the owner itself (the same flow run) is its own.
This holds on a worker with a run policy file; on a user's own command line every run is the
user's. Two flow runs claiming a new name at the same instant are not told apart (the storage has
no atomic create): the training slot then runs them one after the other.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any
from uuid import UUID

import fsspec

from cifar.errors import InvalidParameterError
from flows.run_policy import RunPolicy
from tasks.layout import StorageLayout

RESUMABLE = frozenset({"FAILED", "CRASHED", "CANCELLED"})


class RunNameTakenError(InvalidParameterError):
    """The run name belongs to another flow run that this one may not resume."""


def fingerprint(data_digest: str, params: dict[str, Any]) -> str:
    """What makes a training the same one: its data and its parameters."""
    text = json.dumps({"data": data_digest, "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def claim_run_name(layout: StorageLayout, run_name: str, print_: str, policy: RunPolicy) -> None:
    """Record this flow run as the owner of ``run_name`` (fingerprint ``print_``), unless
    another flow run owns it and this one may not resume it, on a worker with a run policy file
    (without one, a user's own command line, the user owns every run: a run whose driver was
    killed stays Running in Prefect's local database, and its name resumes it).

    Raises:
        RunNameTakenError: Naming the owner, its state, and what to do.
    """
    from prefect.runtime import flow_run

    flow_run_id = flow_run.get_id() or f"outside a flow run ({run_name})"
    fs, path = fsspec.core.url_to_fs(layout.join("owners", f"{run_name}.json"))
    if fs.exists(path):
        owner = json.loads(fs.cat_file(path))
        if owner["flow_run_id"] != flow_run_id and policy.source is not None:
            _check_resumable(run_name, owner, print_)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, json.dumps({"flow_run_id": flow_run_id, "fingerprint": print_}).encode())


def _check_resumable(run_name: str, owner: dict[str, str], print_: str) -> None:
    state = _state_of(owner["flow_run_id"])
    taken = f"run_name {run_name!r} belongs to flow run {owner['flow_run_id']}"
    if state is not None and state not in RESUMABLE:
        raise RunNameTakenError(
            f"{taken} ({state.capitalize()}): only a run that ended without completing may be "
            "resumed under its name. Leave run_name out (each flow run then gets its own) or "
            "choose a new one."
        )
    if owner["fingerprint"] != print_:
        raise RunNameTakenError(
            f"{taken}, which trained on other data or with other parameters: resuming it would "
            "mix two trainings in one run. Leave run_name out or choose a new one."
        )


def _state_of(flow_run_id: str) -> str | None:
    """The flow run's state type (``COMPLETED``, ``RUNNING``, ...), or None where the server
    does not know it."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        flow_run_uuid = UUID(flow_run_id)
    except ValueError:
        return None
    with get_client(sync_client=True) as client:
        try:
            found = client.read_flow_run(flow_run_uuid)
        except ObjectNotFound:
            return None
    return found.state.type.value if found.state is not None else None

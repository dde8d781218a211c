"""The pipeline's MLflow accounts, each with what it needs and no more.

    python -m deployments.mlflow_access

Run as MLflow's administrator against a server with authentication (``mlflow server
--app-name basic-auth``, ``default_permission = NO_PERMISSIONS``: an account sees only what it
was granted): ``MLFLOW_TRACKING_URI``, ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD`` are the admin's. Passwords come from the environment only, never
an argument. Safe to run again (the compose stack's ``deploy`` step runs it each time), and
when a reply is lost (MLflow's client sends the request again, and finds done what the first
one did):

- the pipeline's experiments (``train-cifar``, ``tune-cifar``) and registered models
  (``cifar10-classifier``, ``cifar10-classifier-synthetic``, and those named in
  ``$CIFAR_REGISTERED_MODELS``, comma-separated) exist, created by the admin;
- the publisher, ``$MLFLOW_TRAINER_USER`` (``$MLFLOW_TRAINER_PASSWORD``), the Prefect
  worker's account, has EDIT on each: it creates and ends runs, logs to them, registers
  versions, tags them (``withdrawn`` included) and moves their aliases; it cannot delete an
  experiment, a run, a registered model or a version (MLflow's MANAGE, which the admin keeps);
- the users' account, ``$MLFLOW_USER`` (``$MLFLOW_USER_PASSWORD``), what people who start runs
  are given, has READ on each: it reads runs, metrics, artifacts, versions and aliases, and
  can neither write an artifact, tag a version nor move an alias.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.server import get_app_client
from mlflow.tracking import MlflowClient

from mlops.registry import DEFAULT_MODEL_NAME, SYNTHETIC_SUFFIX
from tasks.train import EXPERIMENT as TRAIN_EXPERIMENT
from tasks.tune import EXPERIMENT as TUNE_EXPERIMENT

EXPERIMENTS = (TRAIN_EXPERIMENT, TUNE_EXPERIMENT)
MODELS = (DEFAULT_MODEL_NAME, DEFAULT_MODEL_NAME + SYNTHETIC_SUFFIX)
MODELS_VARIABLE = "CIFAR_REGISTERED_MODELS"
PUBLISHER, USERS = "EDIT", "READ"  # the publisher's permission, the users' account's


def _exists(error: MlflowException) -> bool:
    return error.error_code == "RESOURCE_ALREADY_EXISTS"


def _missing(error: MlflowException) -> bool:
    return error.error_code == "RESOURCE_DOES_NOT_EXIST"


def _create(create: Callable[..., object], *args: str) -> None:
    """Create what was found missing; done already is done (by a first try whose reply was
    lost, or by a deploy step beside this one)."""
    try:
        create(*args)
    except MlflowException as error:
        if not _exists(error):
            raise


def ensure_user(tracking_uri: str, username: str, password: str) -> None:
    """The account exists and has ``password``. (Looked up first: a failed INSERT would put the
    password's hash in the database server's log.)"""
    auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
    try:
        auth.get_user(username)
    except MlflowException as error:
        if not _missing(error):
            raise
        _create(auth.create_user, username, password)
        print(f"MLflow user {username!r} created")
    auth.update_user_password(username, password)
    print(f"MLflow user {username!r} has its password")


def grant(
    tracking_uri: str,
    username: str,
    experiments: list[str],
    models: list[str],
    permission: str = PUBLISHER,
) -> None:
    """Create what is missing as the admin, and give ``username`` ``permission`` on all of
    it (whatever it had)."""
    client = MlflowClient(tracking_uri)
    auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
    resources = []
    for name in experiments:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            _create(client.create_experiment, name)
            experiment = client.get_experiment_by_name(name)
        resources.append(("experiment", experiment.experiment_id, f"experiment {name!r}"))
    for name in models:
        try:
            client.get_registered_model(name)
        except MlflowException as error:
            if not _missing(error):
                raise
            _create(client.create_registered_model, name)
        resources.append(("registered_model", name, f"registered model {name!r}"))
    verb = {PUBLISHER: "edit", USERS: "read"}.get(permission, permission)
    for resource_type, resource_id, what in resources:
        _permit(auth, username, resource_type, resource_id, permission)
        print(f"{username!r} may {verb} {what}")


def _permit(
    auth: Any, username: str, resource_type: str, resource_id: str, permission: str
) -> None:
    """``username`` has ``permission`` on the resource, whatever it had (each step safe to
    repeat): granted, or found granted (an earlier deploy, or this grant's lost reply) and
    changed if it differs."""
    try:
        auth.grant_user_permission(username, resource_type, resource_id, permission)
        return
    except MlflowException as error:
        if not _exists(error):
            raise
    if auth.get_user_permission(username, resource_type, resource_id).permission == permission:
        return
    try:
        auth.revoke_user_permission(username, resource_type, resource_id)  # whatever it was
    except MlflowException as error:
        if not _missing(error):
            raise
    _create(auth.grant_user_permission, username, resource_type, resource_id, permission)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    needed = ("MLFLOW_TRACKING_URI", "MLFLOW_TRAINER_USER", "MLFLOW_TRAINER_PASSWORD")
    missing = [name for name in (*needed, "MLFLOW_USER", "MLFLOW_USER_PASSWORD")]
    missing = [name for name in missing if not os.environ.get(name)]
    if missing:
        raise SystemExit(f"mlflow_access: set {', '.join(missing)} (see docker/.env.example)")
    tracking_uri, publisher = os.environ["MLFLOW_TRACKING_URI"], os.environ["MLFLOW_TRAINER_USER"]
    users = os.environ["MLFLOW_USER"]
    if users == publisher:
        raise SystemExit(
            "mlflow_access: MLFLOW_USER is MLFLOW_TRAINER_USER: the users' account must not be "
            "the publisher's (it could overwrite artifacts and move aliases); give another name."
        )
    extra = [m.strip() for m in os.environ.get(MODELS_VARIABLE, "").split(",") if m.strip()]
    models = [*MODELS, *extra]
    ensure_user(tracking_uri, publisher, os.environ["MLFLOW_TRAINER_PASSWORD"])
    grant(tracking_uri, publisher, list(EXPERIMENTS), models, PUBLISHER)
    ensure_user(tracking_uri, users, os.environ["MLFLOW_USER_PASSWORD"])
    grant(tracking_uri, users, list(EXPERIMENTS), models, USERS)


if __name__ == "__main__":
    main()

"""The MLflow model registry: register a trained classifier, find its versions and aliases,
take a version out of use. Loading models back: ``mlops.model_loading``.

Every call takes the tracking URI (the registry lives in the same store): nothing here depends
on a process-wide MLflow setting, so a task run alone, or in another process, uses the right
store.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator

import numpy as np
import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

import cifar
from cifar.checkpoint import checkpoint_epoch, load_classifier
from cifar.classifier_file import ARTIFACT_KEY, CLASSIFIER_FILE, save_classifier
from cifar.dataset import Dataset
from cifar.models import Classifier
from mlops.lineage import DIGEST_TAG, SYNTHETIC_TAG
from mlops.version_tags import (
    PROMOTION_TAG,
    REQUEST_TAG,
    WEIGHTS_TAG,
    WITHDRAWN_TAG,
    logged_model_of,
)

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "cifar10-classifier"
SYNTHETIC_SUFFIX = "-synthetic"
MODEL_ARTIFACT = "model"
# What the model needs, pinned to what trained it (a local build's "+cu130" suffix dropped):
# its declared environment (mlops.model_env builds it for the fresh_load gate).
REQUIREMENTS = (
    f"mlflow=={importlib.metadata.version('mlflow')}",
    f"torch=={torch.__version__.split('+')[0]}",
    f"torchvision=={importlib.metadata.version('torchvision').split('+')[0]}",
    f"numpy=={np.__version__}",
)
_STORE_LOCK = threading.Lock()
# The model's code, carried with it: the classes its weights are loaded into, which a service
# loading the model (mlflow models serve, the fresh_load gate) need not have installed; and the
# pyfunc model from code that does it.
MODEL_CODE = os.path.dirname(os.path.abspath(cifar.__file__))
PYFUNC_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyfunc_model.py")


def register_model(
    model: Classifier,
    run_id: str,
    model_name: str,
    tracking_uri: str,
    request_id: str | None = None,
    step: int = 0,
) -> str:
    """Log ``model`` as an MLflow model of the run and register it; return the new version.

    The LoggedModel is a pyfunc model from code (``mlops/pyfunc_model.py``, with the ``cifar``
    package it imports) around the classifier file (weights and what rebuilds them, never a
    pickle), with its signature, input example and pinned requirements; the version is tagged
    with the classifier file's SHA-256 (``weights_sha256``), which every load checks. The model
    takes uint8 images (N, 3, 32, 32) and returns (N, 10) class scores; the LoggedModel carries
    the run's metrics of ``step`` (the epoch of the checkpoint it is). With ``request_id`` (the
    flow run's id), registering is idempotent: the version is created with that id as a tag,
    and a retry after a failure (the registry answered, the reply was lost) finds the version
    its first attempt made instead of making another.

    Raises:
        TypeError: ``model`` is not a ``cifar.models.Classifier`` (what the installed package
            cannot rebuild is never published).
    """
    import mlflow
    import mlflow.pyfunc
    from mlflow.models import Model, infer_signature

    if not isinstance(model, Classifier):
        raise TypeError(
            f"register_model takes a cifar.models.Classifier, not {type(model).__name__}: a "
            "version is loaded into the installed package's classes, never unpickled; build "
            "the model with cifar.models.build_model."
        )
    client = MlflowClient(tracking_uri)
    if request_id is not None and (made := _registered_for(client, model_name, request_id)):
        logger.info("%s version %s was registered by this request already", model_name, made)
        return made
    example = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    with torch.no_grad():
        scores = model.eval()(torch.from_numpy(example)).numpy()
    # The LoggedModel is made here, in the run's experiment: log_model alone would make it in
    # the process's active experiment (MLflow's Default when none is set), where the training
    # account may not write and where nobody looks for it.
    run = client.get_run(run_id)
    made_model = client.create_logged_model(
        run.info.experiment_id,
        name=MODEL_ARTIFACT,
        source_run_id=run_id,
        params={key: str(value) for key, value in run.data.params.items()},
    )
    with tempfile.TemporaryDirectory() as folder, using_store(tracking_uri):
        weights = os.path.join(folder, CLASSIFIER_FILE)
        save_classifier(weights, model)
        # Model.log, as mlflow.pytorch.log_model does: pyfunc's own log_model takes no run_id
        # (it would use the process's active run), and the run lists the model it output.
        logged = Model.log(
            artifact_path=None,  # MLflow 3: the model's name, not a path in the run
            name=MODEL_ARTIFACT,
            flavor=mlflow.pyfunc,
            run_id=run_id,
            python_model=PYFUNC_MODEL,
            artifacts={ARTIFACT_KEY: weights},
            model_id=made_model.model_id,
            signature=infer_signature(example, scores),
            input_example=example,
            pip_requirements=list(REQUIREMENTS),
            code_paths=[MODEL_CODE],  # the classes the weights are loaded into
            step=step,  # its metrics: the checkpoint's epoch, not the run's first
        )
        # register_model, not log_model's registered_model_name: the version needs its tags
        # from the start (the idempotency above finds it by them; every load checks the digest).
        tags = {WEIGHTS_TAG: file_digest(weights)}
        if request_id is not None:
            tags[REQUEST_TAG] = request_id
        version = str(mlflow.register_model(logged.model_uri, model_name, tags=tags).version)
    if request_id is not None:
        version = _keep_first(client, model_name, request_id, version)
    logger.info("Registered %s version %s (model %s)", model_name, version, logged.model_id)
    return version


def file_digest(path: str) -> str:
    """The SHA-256 of the file at ``path``, in hex."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@contextlib.contextmanager
def using_store(tracking_uri: str) -> Iterator[None]:
    """MLflow's model functions (``log_model``, ``register_model``, ``load_model`` of a
    ``models:/`` URI) use the process's tracking URI: point it at ``tracking_uri`` for the
    block, then put it back (unset if it was), so callers keep passing the URI explicitly."""
    import mlflow

    with _STORE_LOCK:
        before = os.environ.get("MLFLOW_TRACKING_URI")  # what mlflow.set_tracking_uri sets
        mlflow.set_tracking_uri(tracking_uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(before)  # type: ignore[arg-type]  # None unsets it


def _usable_versions(client: MlflowClient, model_name: str, request_id: str) -> list[int]:
    """The versions ``request_id`` registered that are in use (not withdrawn by a rollback)."""
    found = client.search_model_versions(
        f"name='{model_name}' and tags.{REQUEST_TAG}='{request_id}'"
    )
    return sorted(int(v.version) for v in found if WITHDRAWN_TAG not in v.tags)


def _registered_for(client: MlflowClient, model_name: str, request_id: str) -> str | None:
    """The first version ``request_id`` registered and still in use, or None."""
    usable = _usable_versions(client, model_name, request_id)
    return str(usable[0]) if usable else None


def _keep_first(client: MlflowClient, model_name: str, request_id: str, created: str) -> str:
    """The first version ``request_id`` registered; the others it made are removed
    (``withdraw_version``). (MLflow's client sends a create again when its reply is lost: the
    registry then made two.)"""
    usable = _usable_versions(client, model_name, request_id)
    for extra in usable[1:]:
        withdraw_version(
            model_name,
            str(extra),
            client.tracking_uri,
            f"a duplicate of version {usable[0]}, made by a retried request",
        )
    return str(usable[0]) if usable else created


def check_requirements() -> None:
    """Check the models' pip requirements against the installed packages, as MLflow does on a
    process's first model save: a scan of every installed distribution (1.2 s here), done once
    per process. A caller with idle time does it ahead; it warns as the save would."""
    from mlflow.utils.requirements_utils import warn_dependency_requirement_mismatches

    warn_dependency_requirement_mismatches(list(REQUIREMENTS))


def logged_model_id(model_name: str, version: str, tracking_uri: str) -> str | None:
    """The id of the LoggedModel ``version`` was registered from (``logged_model_of``)."""
    return logged_model_of(MlflowClient(tracking_uri).get_model_version(model_name, version))


def version_at_alias(model_name: str, alias: str, tracking_uri: str) -> str | None:
    """The version holding ``alias``, or None (also when the model does not exist)."""
    try:
        version = MlflowClient(tracking_uri).get_model_version_by_alias(model_name, alias)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(exc).lower():
            return None
        raise
    return str(version.version)


def withdraw_version(model_name: str, version: str, tracking_uri: str, reason: str) -> None:
    """Take ``version`` out of use: tag it ``withdrawn`` with ``reason``; it holds no alias and
    is never loaded by one. It is not deleted: the registry keeps what was published and
    undone (its MLflow run and model stay too), and version numbers are never reused."""
    client = MlflowClient(tracking_uri)
    client.set_model_version_tag(model_name, version, WITHDRAWN_TAG, reason)
    logger.warning("%s version %s withdrawn: %s", model_name, version, reason)


def settled(tags: dict[str, str], aliases: list[str]) -> bool:
    """Whether a version's publication ended one way or another: it holds an alias, the promote
    step recorded its decision (tag ``promotion``), or it was withdrawn."""
    return bool(aliases) or PROMOTION_TAG in tags or WITHDRAWN_TAG in tags


def withdraw_unfinished(
    model_name: str, tracking_uri: str, in_progress: Callable[[str], bool]
) -> list[str]:
    """Withdraw the versions of ``model_name`` a publish left unsettled (``settled``) because
    it never finished (its process was killed, or MLflow was out of reach during its
    rollback), unless ``in_progress(flow_run_id)`` says their flow run is still publishing.
    Idempotent. Returns the versions withdrawn."""
    client = MlflowClient(tracking_uri)
    withdrawn = []
    for found in client.search_model_versions(f"name='{model_name}'"):
        tags = dict(found.tags or {})
        if settled(tags, []):
            continue
        full = client.get_model_version(model_name, found.version)  # search omits aliases
        if settled(tags, list(full.aliases or [])):
            continue
        request = tags.get(REQUEST_TAG)
        if request is not None and in_progress(request):
            continue
        again = client.get_model_version(model_name, found.version)  # it may have just ended
        if settled(dict(again.tags or {}), list(again.aliases or [])):
            continue
        withdraw_version(
            model_name,
            str(found.version),
            tracking_uri,
            f"left by a publish that never finished (flow run {request or 'unknown'})",
        )
        withdrawn.append(str(found.version))
    return withdrawn


def model_name_for(requested: str | None, synthetic: bool) -> str:
    """The registered model a run publishes to: ``requested`` if given, else
    ``DEFAULT_MODEL_NAME``, with ``-synthetic`` appended for a run on synthetic data, so a
    model of synthetic images never competes with (or serves in place of) real ones."""
    if requested:
        return requested
    return f"{DEFAULT_MODEL_NAME}{SYNTHETIC_SUFFIX}" if synthetic else DEFAULT_MODEL_NAME


def register_checkpoint(
    checkpoint_uri: str,
    run_id: str,
    model_name: str,
    tracking_uri: str,
    dataset: Dataset,
    request_id: str | None = None,
) -> str:
    """Register the classifier of a training checkpoint as a new version of ``model_name``
    (idempotent per ``request_id``: see ``register_model``), tagged with the digest of the data
    it was trained on and whether that data is synthetic."""
    classifier = load_classifier(checkpoint_uri)
    epoch = checkpoint_epoch(checkpoint_uri)
    version = register_model(classifier, run_id, model_name, tracking_uri, request_id, epoch)
    client = MlflowClient(tracking_uri)
    client.set_model_version_tag(model_name, version, DIGEST_TAG, dataset.manifest.digest())
    synthetic = str(dataset.manifest.synthetic).lower()
    client.set_model_version_tag(model_name, version, SYNTHETIC_TAG, synthetic)
    return version

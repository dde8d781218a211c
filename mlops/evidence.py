"""A version's evidence: its per-image results on a test split, kept with its LoggedModel, their
sha256 on the version (``evidence/{test_digest}``) and its accuracy there
(``test_accuracy/{test_digest}``), so a champion is scored once per test split and a
tampered or lost file is scored again, never trusted."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile

import numpy as np
from mlflow.artifacts import download_artifacts
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from mlops.registry import logged_model_id

logger = logging.getLogger(__name__)


def accuracy_tag(test_digest: str) -> str:
    """The version tag holding its accuracy on the test split with this digest."""
    return f"test_accuracy/{test_digest}"


def _correct_file(test_digest: str) -> str:
    return f"correct-{test_digest}.npy"


def evidence_tag(test_digest: str) -> str:
    """The version tag holding the sha256 of its per-image results on that test split."""
    return f"evidence/{test_digest}"


def _digest(correct: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(correct, dtype=bool).tobytes()).hexdigest()


def keep_evidence(
    client: MlflowClient, model_name: str, version: str, test_digest: str, correct: np.ndarray
) -> None:
    """Store the version's per-image results on ``test_digest`` with its LoggedModel, and their
    hash on the version. A version with no LoggedModel (registered before MLflow 3's model API)
    keeps none: it is scored again when needed."""
    model_id = logged_model_id(model_name, version, client.tracking_uri)
    if model_id is None:
        return
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, _correct_file(test_digest))
        np.save(path, np.asarray(correct, dtype=bool))
        client.log_model_artifact(model_id, path, "evaluation")
    client.set_model_version_tag(model_name, version, evidence_tag(test_digest), _digest(correct))


def read_evidence(
    client: MlflowClient, model_name: str, version: str, test_digest: str
) -> np.ndarray | None:
    """The per-image results ``keep_evidence`` stored, or None when there are none or they do
    not match the hash recorded on the version."""
    expected = client.get_model_version(model_name, version).tags.get(evidence_tag(test_digest))
    model_id = logged_model_id(model_name, version, client.tracking_uri)
    if expected is None or model_id is None:
        return None
    location = client.get_logged_model(model_id).artifact_location
    with tempfile.TemporaryDirectory() as directory:
        try:
            path = download_artifacts(
                artifact_uri=f"{location.rstrip('/')}/evaluation/{_correct_file(test_digest)}",
                dst_path=directory,
                tracking_uri=client.tracking_uri,
            )
        except (MlflowException, OSError):
            return None
        correct = np.load(path, allow_pickle=False)
    if _digest(correct) != expected:
        logger.warning(
            "%s version %s: its evidence on test split %s does not match its hash; scored again",
            model_name,
            version,
            test_digest,
        )
        return None
    return correct

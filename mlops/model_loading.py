"""Loading registered models back: by alias or version in this process, or scored by a new
Python process in the version's own environment (what a service that loads the model sees).

In this process a version is never unpickled and never runs code from the registry: its
classifier file (weights and what rebuilds them) is downloaded, checked against the SHA-256 its
publisher recorded on the version (``weights_sha256``), read with ``torch.load(...,
weights_only=True)`` and loaded into the installed package's classes. A version without that
digest (registered by anything but this pipeline) or whose file changed since is refused."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient
from torch import nn

from cifar.classifier_file import CLASSIFIER_FILE, read_classifier
from cifar.errors import PipelineError
from mlops.model_env import ModelEnvironmentError, environment_variables, python_for
from mlops.registry import file_digest, using_store, version_at_alias
from mlops.version_tags import CHAMPION, WEIGHTS_TAG

FRESH_PROCESS_TIMEOUT_S = 300.0


# A service's process: the project is not importable (only the code the model carries, under
# the folder it is downloaded to), and no GPU (the gate scores on CPU whatever trained it).
_SCORE_IN_FRESH_PROCESS = """
import importlib.abc, importlib.machinery, sys
import numpy as np
import mlflow.pyfunc

PROJECT, CARRIED = {project!r}, sys.argv[4]

class ProjectHidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in PROJECT:
            return None
        carried = [p for p in (path or sys.path) if str(p).startswith(CARRIED)]
        spec = importlib.machinery.PathFinder.find_spec(name, carried)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the model's code)")
        return spec

sys.meta_path.insert(0, ProjectHidden())
model = mlflow.pyfunc.load_model(sys.argv[1], dst_path=CARRIED)
np.save(sys.argv[3], np.asarray(model.predict(np.load(sys.argv[2]))))
"""
PROJECT_PACKAGES = ("cifar", "trainlib", "mlops", "tasks", "flows", "cli")


class ModelNotFoundError(PipelineError, LookupError):
    """The registry has no such model, version or alias."""


class ModelIntegrityError(PipelineError):
    """A version's classifier file is not what its publisher recorded, or it has no record."""


def scores_in_fresh_process(
    model_name: str, version: str, tracking_uri: str, images: np.ndarray
) -> np.ndarray:
    """The class scores a new Python process gets for ``images`` from ``version`` loaded from
    the registry (``mlflow.pyfunc.load_model("models:/NAME/VERSION")``): what a service that
    loads the model sees. The process runs in the version's declared environment
    (``mlops.model_env``: by default a virtual environment of its requirements alone), with
    nothing of this process's state, none of the project's packages importable but the code
    the model carries (``code_paths``), and no GPU.

    Raises:
        RuntimeError: The process could not load or run the model (its error's last lines), or
            the version's environment cannot be had (why).
    """
    with tempfile.TemporaryDirectory() as directory:
        inputs, outputs = os.path.join(directory, "in.npy"), os.path.join(directory, "out.npy")
        carried = os.path.join(directory, "model")
        os.mkdir(carried)
        np.save(inputs, images)
        uri = f"models:/{model_name}/{version}"
        try:
            python = python_for(_environment_files(uri, tracking_uri, directory))
        except ModelEnvironmentError as error:
            raise RuntimeError(f"its declared environment cannot be had: {error}") from error
        script = _SCORE_IN_FRESH_PROCESS.format(project=set(PROJECT_PACKAGES))
        variables = {**environment_variables(), "MLFLOW_TRACKING_URI": tracking_uri}
        done = subprocess.run(
            [python, "-c", script, uri, inputs, outputs, carried],
            cwd=directory,
            env={**variables, "CUDA_VISIBLE_DEVICES": ""},
            capture_output=True,
            text=True,
            timeout=FRESH_PROCESS_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            last = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"a new process could not load and run it: {last}")
        return np.load(outputs, allow_pickle=False)


def _environment_files(uri: str, tracking_uri: str, directory: str) -> Path:
    """A folder holding the version's ``python_env.yaml`` and ``requirements.txt``."""
    import mlflow.artifacts

    folder = Path(directory) / "declared"
    folder.mkdir()
    with using_store(tracking_uri):
        for name in ("python_env.yaml", "requirements.txt"):
            try:
                mlflow.artifacts.download_artifacts(f"{uri}/{name}", dst_path=str(folder))
            except Exception as error:  # absent, or the registry does not answer
                raise RuntimeError(f"its {name} cannot be read ({error})") from error
    return folder


def check_readable(model_name: str, version: str, tracking_uri: str) -> None:
    """Read ``version``'s model description (its MLmodel file) from the registry, as a new
    process would first; raises what the registry or the network raise."""
    import mlflow.artifacts

    with using_store(tracking_uri), tempfile.TemporaryDirectory() as directory:
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{model_name}/{version}/MLmodel", dst_path=directory
        )


def load_version(model_name: str, version: str, tracking_uri: str) -> nn.Module:
    """The registered model ``model_name`` at ``version``, its digest checked (module doc).

    Raises:
        ModelIntegrityError: The version has no recorded digest, or its file differs from it.
    """
    import mlflow.artifacts

    tags = MlflowClient(tracking_uri).get_model_version(model_name, version).tags or {}
    recorded = tags.get(WEIGHTS_TAG)
    if recorded is None:
        raise ModelIntegrityError(
            f"{model_name} version {version} has no {WEIGHTS_TAG} tag: this pipeline did not "
            "publish it, so it is not loaded (its files could run code). Publish models with "
            "train-cifar or tune-cifar."
        )
    uri = f"models:/{model_name}/{version}/artifacts/{CLASSIFIER_FILE}"
    with using_store(tracking_uri), tempfile.TemporaryDirectory() as directory:
        path = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=directory)
        if (actual := file_digest(path)) != recorded:
            raise ModelIntegrityError(
                f"{model_name} version {version}'s {CLASSIFIER_FILE} has SHA-256 {actual}, but "
                f"its publisher recorded {recorded}: the file was changed after publishing, so "
                "it is not loaded. Withdraw the version (or restore the file) and alert whoever "
                "administers MLflow."
            )
        return read_classifier(path)


def load_model(model_name: str, alias: str, tracking_uri: str) -> tuple[nn.Module, str]:
    """The registered model at ``alias`` (``models:/NAME@ALIAS``) and its version.

    Raises:
        ModelNotFoundError: No version of ``model_name`` has the alias.
        ModelIntegrityError: See ``load_version``.
    """
    for _ in range(3):  # the alias may move while the model loads: then load it again
        version = version_at_alias(model_name, alias, tracking_uri)
        if version is None:
            raise ModelNotFoundError(
                f"Model {model_name!r} has no version with alias @{alias} in {tracking_uri}; "
                f"train one first (flow train-cifar), or pick an existing model and alias "
                f"(e.g. @{CHAMPION})."
            )
        model = load_version(model_name, version, tracking_uri)
        if version_at_alias(model_name, alias, tracking_uri) == version:
            return model, version
    raise RuntimeError(f"@{alias} of {model_name!r} moved three times while loading; try again")

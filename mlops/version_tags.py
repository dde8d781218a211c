"""The names the registry gives model versions: aliases and tags, and what a version was made
from (no torch: the services' image, which never loads a model, reads them too)."""

from typing import Any

CHAMPION = "champion"
CHALLENGER = "challenger"
ALIASES = (CHAMPION, CHALLENGER)
REQUEST_TAG = "prefect_flow_run_id"  # the flow run that registered a version
WITHDRAWN_TAG = "withdrawn"  # a version taken out of use: a rollback, a duplicate, a sweep
PROMOTION_TAG = "promotion"  # the promote step's decision, recorded on the version
WEIGHTS_TAG = "weights_sha256"  # the classifier file's digest, recorded by the publisher


def logged_model_of(version: Any) -> str | None:
    """The id of the LoggedModel a registry ``ModelVersion`` was made from (None: a version
    registered from a run's artifacts, before MLflow 3's model API). MLflow's SQL registry does
    not keep the version's ``model_id``; its ``source`` says it: models:/<id>."""
    if getattr(version, "model_id", None):
        return str(version.model_id)
    source = str(version.source or "")
    return source.removeprefix("models:/") if source.startswith("models:/m-") else None

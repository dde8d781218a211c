"""Whether training again would change anything.

A run on the data the champion was trained on, with its code (the commit) and its training
configuration, trains the same model again (the seed is part of the configuration): it spends
the cluster's hours and registers a near-identical version. So does a run of a recipe (data,
code, configuration) the ledger already holds a comparison of (``mlops.ledger``): a recipe that
lost against the champion is not trained and tested again until, by chance, it wins. Such a run
ends early instead, ``Completed``, saying why in its summary and a Prefect artifact; ``force``
trains anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from mlops import ledger
from mlops.lineage import DIGEST_TAG
from mlops.registry import version_at_alias
from mlops.tracking import git_sha
from mlops.version_tags import CHAMPION
from tasks.retrying import TRANSIENT_RETRIES


def unchanged_since_champion(
    model_name: str, data_digest: str, params: Mapping[str, Any], tracking_uri: str
) -> str | None:
    """Why a run with these data, code and ``params`` (the training run's MLflow params) would
    change nothing, or None: it would (no champion, other data, another commit or an unknown
    one, another configuration)."""
    client = MlflowClient(tracking_uri)
    code = git_sha()
    if code != "unknown" and (earlier := _compared(client, model_name, data_digest, code, params)):
        return (
            f"Nothing would change: this data (digest {data_digest}), code (commit "
            f"{code[:12]}) and configuration made version {earlier.version} of {model_name}, "
            f"already compared with champion version {earlier.champion} on test split "
            f"{earlier.split} ({earlier.verdict}). Not trained and tested again; run with "
            "force=true (train-cifar --force) to train anyway."
        )
    version = version_at_alias(model_name, CHAMPION, tracking_uri)
    if version is None:
        return None
    registered = client.get_model_version(model_name, version)
    if registered.tags.get(DIGEST_TAG) != data_digest or not registered.run_id:
        return None
    run = client.get_run(registered.run_id)
    if code == "unknown" or run.data.tags.get("git_sha") != code:
        return None
    if any(run.data.params.get(key) != str(value) for key, value in params.items()):
        return None
    return (
        f"Nothing would change: champion version {version} of {model_name} was trained on the "
        f"same data (digest {data_digest}), code (commit {code[:12]}) and configuration. Not "
        "trained again; run with force=true (train-cifar --force) to train anyway."
    )


def _compared(
    client: MlflowClient,
    model_name: str,
    data_digest: str,
    code: str,
    params: Mapping[str, Any],
) -> ledger.Entry | None:
    """The ledger's comparison of a version of this recipe, or None (no such model yet)."""
    try:
        return ledger.compared(client, model_name, ledger.recipe(data_digest, code, params))
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


@task(name="check-unchanged", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def unchanged_task(
    model_name: str, data_digest: str, params: Mapping[str, Any], tracking_uri: str
) -> str | None:
    """``unchanged_since_champion``, and a Prefect artifact saying why when nothing would."""
    reason = unchanged_since_champion(model_name, data_digest, params, tracking_uri)
    if reason is not None:
        create_markdown_artifact(
            key="train-cifar-skipped", markdown=f"# Not trained\n\n{reason}", description=reason
        )
    return reason

"""The evaluate steps: a registered version evaluated on the test split (with its confusion
matrix as a Prefect table), and the champion scored on the same images. The evaluation itself:
``mlops.evaluation``."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from cifar.dataset import Dataset
from mlops.evaluation import Evaluation, champion_score, evaluate_version
from tasks.retrying import TRANSIENT_RETRIES

champion_score_task = task(name="score-champion", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)(
    champion_score
)


@task(name="evaluate", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def evaluate_task(
    model_name: str,
    version: str,
    dataset: Dataset,
    tracking_uri: str,
    check_fresh_load: bool = True,
) -> Evaluation:
    """Evaluate and record, with the confusion matrix as a Prefect table."""
    evaluation = evaluate_version(model_name, version, dataset, tracking_uri, check_fresh_load)
    class_names = dataset.manifest.class_names
    create_table_artifact(
        key="confusion-matrix",
        table=[
            {"true": name, **dict(zip(class_names, row, strict=True))}
            for name, row in zip(class_names, evaluation.confusion, strict=True)
        ],
        description=f"{model_name} v{version}: test accuracy {evaluation.accuracy:.4f}",
    )
    return evaluation

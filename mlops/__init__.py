"""The model lifecycle rules, free of Prefect: the MLflow registry, loading registered models,
lineage, release gates, the paired test and promotion's model card.

Errors (each a ``cifar.errors.PipelineError``)::

    model_loading.ModelNotFoundError    no such registered model or alias (LookupError)
"""

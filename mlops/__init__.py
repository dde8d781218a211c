"""The model lifecycle rules, free of Prefect: the MLflow registry, loading registered models,
lineage, release gates, the paired test and promotion's model card."""

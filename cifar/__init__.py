"""The CIFAR-10 domain: the archive format, the dataset on storage, the models, augmentation,
the checkpoint format and the per-rank training function.

Rank processes import this package, so it imports neither Prefect nor MLflow (checked by
``lint-imports``).
"""

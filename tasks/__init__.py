"""Prefect tasks of the train-cifar pipeline (see the pipeline issue); empty for now."""

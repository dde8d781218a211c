"""Prefect flows of the train-cifar pipeline (see the pipeline issue); empty for now."""

"""The Prefect flows: train-cifar, tune-cifar, predict-cifar and the publish subflow they share."""

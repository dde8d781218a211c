"""The Prefect flows train-cifar, tune-cifar and predict-cifar, and their command-line front end."""

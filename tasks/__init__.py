"""The train-cifar pipeline's Prefect tasks, the request and result types they pass, and the
CIFAR domain code its rank processes run (format, dataset, models, training loop)."""

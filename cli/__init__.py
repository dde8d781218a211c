"""The command-line front end: ``train-cifar``, ``tune-cifar`` and ``predict-cifar`` run the
flows locally (a temporary Prefect server, a LocalCluster, MLflow in a sqlite file).

Errors (each a ``cifar.errors.PipelineError``)::

    local_server.PrefectServerError     Prefect's temporary server did not start
"""

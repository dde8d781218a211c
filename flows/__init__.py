"""The Prefect flows: train-cifar, tune-cifar, predict-cifar, sweep-storage and the publish
subflow they share; the head train-cifar and tune-cifar share (``prepare.py``) and what only a
flow run decides: which Dask clusters it may start (``clusters.py``) and how long it may take
(``time_limit.py``).

Errors (each a ``cifar.errors.PipelineError``)::

    publish.PublishError      register → evaluate → promote failed, rolled back
    run_policy.PolicyError    a parameter names a place or server the worker's policy refuses
                              (an InvalidParameterError)

Each flow persists its return value (``persist_result=True``, in Prefect's local result
storage): on a SQLite Prefect server a write can wait up to a minute for the database lock
(PrefectHQ/prefect#18934), and when the flow's final ``Completed`` is then sent again, Prefect
keeps the server's copy of the state, which holds the value only if it was persisted; otherwise
the command that ran the flow fails with ``MissingResult`` after the work is done.
"""

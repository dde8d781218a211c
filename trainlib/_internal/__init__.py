"""trainlib's engine, shared by every front end (``trainlib.torch``, ``trainlib.data``, ...).

Nothing here is public API. The driver side (``controller``, ``worker_group``, ``cluster``,
``reports``, ``checkpoint_manager``, ``watchdog``) runs in the process that calls ``fit()``;
``supervisor`` runs inside a Dask worker; ``rank_main`` and ``session`` run in a rank process.
"""

"""Ray Tune's ``ray.tune.integration.ray_train``: a Train run started inside a Tune trial
reports to the Tuner (Ray Train v2's recommended way to tune a Train run)."""

from __future__ import annotations

import trainlib
from trainlib._internal.rank.process_globals import RANK
from trainlib.callbacks import Callback, Report

CHECKPOINT_PATH_KEY = "checkpoint_path"


class TuneReportCallback(Callback):
    """Forwards each report of the Train run it is given to (its rank 0's metrics, plus
    ``checkpoint_path`` when the report committed a checkpoint) to the Tune trial that started
    the run, so the Tuner compares, prunes and returns them as its own.

    Use it in the trial function: ``TorchTrainer(..., run_config=RunConfig(callbacks=
    [TuneReportCallback()])).fit()``. The Train run's ranks are placed on the Dask cluster the
    trial runs on (a ``DaskConfig()`` inside a trial connects to it). Outside a trial (the
    trial function called directly) it forwards nothing, as Ray's.
    """

    def on_report(self, report: Report) -> None:
        if RANK.session is None:
            return
        metrics = dict(report.metrics)
        if report.checkpoint is not None:
            metrics[CHECKPOINT_PATH_KEY] = report.checkpoint.path
        trainlib.report(metrics)

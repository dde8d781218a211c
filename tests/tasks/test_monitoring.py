"""What a run shows: MLflow links, the summary, and the pipeline's log levels during a task."""

from __future__ import annotations

import logging

from tasks.monitoring import mlflow_links, pipeline_info_logs


def test_monitoring_links_point_at_a_server_or_say_how_to_look() -> None:
    run, version = mlflow_links("http://mlflow:5000/", "1", "abc", "m", "2")
    assert run == "[run abc](http://mlflow:5000/#/experiments/1/runs/abc)"
    assert version == "[m v2](http://mlflow:5000/#/models/m/versions/2)"
    run, _ = mlflow_links("sqlite:////data/mlflow.db", "1", "abc", "m", "2")
    assert "mlflow ui --backend-store-uri sqlite:////data/mlflow.db" in run


def test_monitoring_info_logs_only_while_the_task_runs() -> None:
    logger = logging.getLogger("trainlib")
    before = logger.level
    with pipeline_info_logs():
        assert logging.getLogger("tasks").isEnabledFor(logging.INFO)
        assert logging.getLogger("cifar").isEnabledFor(logging.INFO)
        assert logger.isEnabledFor(logging.INFO)
    assert logger.level == before

from __future__ import annotations

import pytest

import trainlib
import trainlib.air
import trainlib.air.session
import trainlib.collective
import trainlib.data
import trainlib.sgd
import trainlib.torch
import trainlib.tune

DOCUMENTED_TRAINLIB = {
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointError",
    "CheckpointUploadMode",
    "ClusterError",
    "ConfigError",
    "ControllerError",
    "DaskConfig",
    "DataConfig",
    "DatasetError",
    "FailureConfig",
    "GroupInfo",
    "LoggingConfig",
    "NotEnoughWorkersError",
    "PreemptionInfo",
    "RankError",
    "RankFailure",
    "RankPlacement",
    "Report",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "RunInfo",
    "ScalingConfig",
    "SyncConfig",
    "TorchConfig",
    "TrackingCallback",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "TrainlibError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
}
DOCUMENTED_COLLECTIVE = {"barrier", "broadcast_from_rank_zero"}
DOCUMENTED_DATA = {
    "ActorPoolStrategy",
    "AggregateFn",
    "DataConfig",
    "DataIterator",
    "Dataset",
    "ExecutionOptions",
    "ExecutionResources",
    "GroupedData",
    "Schema",
    "from_arrow",
    "from_dask",
    "from_items",
    "from_numpy",
    "from_pandas",
    "from_torch",
    "get_dataset_shard",
    "range",
    "read_binary_files",
    "read_csv",
    "read_images",
    "read_json",
    "read_numpy",
    "read_parquet",
    "read_text",
}
DOCUMENTED_AIR = {
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "session",
}
DOCUMENTED_AIR_SESSION = {
    "get_checkpoint",
    "get_dataset_shard",
    "get_experiment_name",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_world_rank",
    "get_world_size",
    "report",
}
DOCUMENTED_SGD = {
    "MixedPrecision",
    "PyTorchTrainable",
    "PyTorchTrainer",
    "get_mixed_precision",
    "train_epoch",
    "validate_epoch",
}
DOCUMENTED_TORCH = {
    "ScalingConfig",
    "TorchConfig",
    "TorchTrainer",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
}
DOCUMENTED_TUNE = {
    "ASHAScheduler",
    "CLIReporter",
    "JupyterNotebookReporter",
    "SyncConfig",
    "AsyncHyperBandScheduler",
    "BasicVariantGenerator",
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "ExperimentAnalysis",
    "FIFOScheduler",
    "FailureConfig",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "OptunaSearch",
    "Result",
    "ResultGrid",
    "RunConfig",
    "Searcher",
    "Stopper",
    "Trainable",
    "Trial",
    "TrialScheduler",
    "TuneConfig",
    "TuneContext",
    "Tuner",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "randn",
    "quniform",
    "randint",
    "report",
    "run",
    "sample_from",
    "uniform",
    "with_parameters",
    "PlacementGroupFactory",
    "with_resources",
}


def test_public_api_matches_documented_names() -> None:
    for package, documented in (
        (trainlib, DOCUMENTED_TRAINLIB),
        (trainlib.collective, DOCUMENTED_COLLECTIVE),
        (trainlib.data, DOCUMENTED_DATA),
        (trainlib.torch, DOCUMENTED_TORCH),
        (trainlib.air, DOCUMENTED_AIR),
        (trainlib.air.session, DOCUMENTED_AIR_SESSION),
        (trainlib.sgd, DOCUMENTED_SGD),
        (trainlib.tune, DOCUMENTED_TUNE),
    ):
        assert set(package.__all__) == documented
        for name in package.__all__:
            assert hasattr(package, name)


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_public_api_import_does_not_load_dask() -> None:
    """Rank processes import the user's module (and so trainlib.torch): keep them light. A
    tracker's package is imported only when its integration is used."""
    import subprocess
    import sys

    code = (
        "import sys, trainlib, trainlib.torch, trainlib.data, trainlib.air, trainlib.sgd, "
        "trainlib.tune, trainlib.collective, trainlib.air.integrations.mlflow; "
        "print(any(m in sys.modules for m in ('distributed', 'dask', 'optuna', 'mlflow')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


RAY_TRAIN_V2_PATHS = {
    "trainlib.v2.api.config": {
        "CheckpointConfig",
        "FailureConfig",
        "LoggingConfig",
        "RunConfig",
        "ScalingConfig",
    },
    "trainlib.v2.api.context": {"TrainContext"},
    "trainlib.v2.api.data_parallel_trainer": {"DataParallelTrainer"},
    "trainlib.v2.api.callback": {"UserCallback"},
    "trainlib.v2.api.exceptions": {"ControllerError", "TrainingFailedError", "WorkerGroupError"},
    "trainlib.v2.api.preemption": {"PreemptionInfo"},
    "trainlib.v2.api.report_config": {"CheckpointConsistencyMode", "CheckpointUploadMode"},
    "trainlib.v2.api.reported_checkpoint": {"ReportedCheckpoint", "ReportedCheckpointStatus"},
    "trainlib.v2.api.result": {"Result"},
    "trainlib.v2.api.train_fn_utils": {
        "get_all_reported_checkpoints",
        "get_checkpoint",
        "get_context",
        "get_dataset_shard",
        "get_preemption_info",
        "report",
    },
    "trainlib.v2.api.validation_config": {
        "ValidationConfig",
        "ValidationFn",
        "ValidationTaskConfig",
    },
    "trainlib.v2.torch.torch_trainer": {"TorchTrainer"},
    "trainlib.v2.torch.train_loop_utils": {
        "backward",
        "enable_reproducibility",
        "get_device",
        "get_devices",
        "prepare_data_loader",
        "prepare_model",
        "prepare_optimizer",
    },
}


def test_ray_train_v2_module_paths_hold_trainlibs_own_objects() -> None:
    """``ray.train.v2.api.config`` -> ``trainlib.v2.api.config`` and the like: each name is
    the very object ``trainlib`` exports (no second class that isinstance checks would miss)."""
    import importlib

    import trainlib.data_parallel_trainer
    import trainlib.torch
    import trainlib.validation

    homes = (trainlib, trainlib.torch, trainlib.data_parallel_trainer, trainlib.validation)
    for path, names in RAY_TRAIN_V2_PATHS.items():
        module = importlib.import_module(path)
        assert set(module.__all__) == names, path
        for name in names:
            home = next(h for h in homes if hasattr(h, name))
            assert getattr(module, name) is getattr(home, name), (path, name)

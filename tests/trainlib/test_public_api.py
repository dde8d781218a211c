from __future__ import annotations

import trainlib
import trainlib.torch

DOCUMENTED_TRAINLIB = {
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "DaskConfig",
    "FailureConfig",
    "NotEnoughWorkersError",
    "RankFailure",
    "Report",
    "Result",
    "RunConfig",
    "RunInfo",
    "ScalingConfig",
    "TorchConfig",
    "TrainContext",
    "TrainingFailedError",
    "TrainlibError",
    "WorkerGroupError",
    "get_checkpoint",
    "get_context",
    "report",
}
DOCUMENTED_TORCH = {
    "TorchConfig",
    "TorchTrainer",
    "get_device",
    "prepare_data_loader",
    "prepare_model",
}


def test_public_api_matches_documented_names() -> None:
    assert set(trainlib.__all__) == DOCUMENTED_TRAINLIB
    assert set(trainlib.torch.__all__) == DOCUMENTED_TORCH
    for name in trainlib.__all__:
        assert hasattr(trainlib, name)
    for name in trainlib.torch.__all__:
        assert hasattr(trainlib.torch, name)


def test_public_api_import_does_not_load_dask() -> None:
    """Rank processes import the user's module (and so trainlib.torch): keep them light."""
    import subprocess
    import sys

    code = "import sys, trainlib, trainlib.torch; print('distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

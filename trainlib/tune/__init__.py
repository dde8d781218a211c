"""Hyperparameter search, as in ``ray.tune``, with Optuna doing the searching.

Port a Ray Tune search by changing imports: ``ray.tune`` -> ``trainlib.tune``. Trials are
trainlib runs sharing one Dask cluster; see ``Tuner``.
"""

from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig
from trainlib.ray_hints import CLIReporter, JupyterNotebookReporter, SyncConfig
from trainlib.reporting import get_checkpoint, report
from trainlib.result import Result
from trainlib.tune.analysis import ExperimentAnalysis
from trainlib.tune.callback import Callback, Trial
from trainlib.tune.class_api import Trainable
from trainlib.tune.config import TuneConfig
from trainlib.tune.context import TuneContext, get_context
from trainlib.tune.parameters import with_parameters
from trainlib.tune.resources import PlacementGroupFactory, with_resources
from trainlib.tune.result_grid import ResultGrid
from trainlib.tune.run import run
from trainlib.tune.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    TrialScheduler,
)
from trainlib.tune.search import BasicVariantGenerator, OptunaSearch, Searcher
from trainlib.tune.search_space import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from trainlib.tune.stopper import Stopper
from trainlib.tune.tuner import Tuner

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "BasicVariantGenerator",
    "CLIReporter",
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "ExperimentAnalysis",
    "FIFOScheduler",
    "FailureConfig",
    "HyperBandScheduler",
    "JupyterNotebookReporter",
    "MedianStoppingRule",
    "OptunaSearch",
    "PlacementGroupFactory",
    "Result",
    "ResultGrid",
    "RunConfig",
    "Searcher",
    "Stopper",
    "SyncConfig",
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
    "quniform",
    "randint",
    "randn",
    "report",
    "run",
    "sample_from",
    "uniform",
    "with_parameters",
    "with_resources",
]

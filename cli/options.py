"""The commands' options: the types that explain a wrong value, and the options the commands
share. Each option's name is the flow parameter it sets (``--run-name`` sets ``run_name``).

Nothing here imports Prefect, torch or the flows: ``--help``, ``--version`` and a mistyped
option answer at once.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
from collections.abc import Callable
from typing import Any

from cifar.format import OFFICIAL_URL

LOG_FILE_VARIABLE = "CIFAR_LOG_FILE"
_PACKAGE = "dask-train-cifar"


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser whose ``--help`` shows every option's default, with ``--version``."""
    made = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=_ShowsDefaults,
        allow_abbrev=False,  # "--epoch" is a typo, not --epochs: an option added later can't clash
    )
    made.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version(_PACKAGE)}",
    )
    return made


class _ShowsDefaults(argparse.HelpFormatter):
    """Each option's help ends with its default, unless it says it already (or is a flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        flag = action.nargs == 0
        if "(default" in help or flag or action.default is argparse.SUPPRESS:
            return help
        shown = "none" if action.default is None else "%(default)s"
        return f"{help} (default: {shown})"


def add_run_options(made: argparse.ArgumentParser, command: str, timeout_minutes: float) -> None:
    """``--timeout-minutes``, and ``--debug`` and ``--log-file``: where the full log goes."""
    made.add_argument(
        "--timeout-minutes",
        type=positive_float,
        default=timeout_minutes,
        help="stop the run, failed, once it has run this long",
    )
    made.add_argument("--debug", action="store_true", help="print full tracebacks of errors")
    made.add_argument(
        "--log-file",
        default=os.environ.get(LOG_FILE_VARIABLE, f"{command}.log"),
        help=f"the full log of the run (also ${LOG_FILE_VARIABLE}); kept under 10 MB, with one "
        "older file beside it",
    )


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def number(text: str) -> float:
    """Any number."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def json_object(example: str) -> Callable[[str], dict[str, Any]]:
    """A JSON object (``{...}``); the error shows ``example``."""

    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(
                f"expected a JSON object such as {example}, got {text!r} "
                f"({error.msg} at character {error.pos + 1})"
            ) from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(
                f"expected a JSON object such as {example}, got {type(value).__name__} {text!r}"
            )
        return value

    parse.__name__ = "JSON object"
    return parse


def add_data_options(made: argparse.ArgumentParser) -> None:
    """Where the archive comes from and where the dataset and runs go."""
    add = made.add_argument
    add(
        "--data-url",
        default=OFFICIAL_URL,
        help="the CIFAR-10 python archive: https://, s3://, file:// or a local path",
    )
    add(
        "--data-md5",
        default=None,
        help="its expected md5 (default: the official one for the official URL; none otherwise)",
    )
    add(
        "--synthetic",
        action="store_true",
        help="generate an archive in the CIFAR-10 format (offline machines, CI) and use it",
    )
    add(
        "--storage-path",
        default=None,
        help="a local folder or an s3:// URL (default: $CIFAR_STORAGE_PATH, else ./cifar-data)",
    )
    add("--rows-per-file", type=positive_int, default=2500, help="images per dataset file")


def add_cluster_options(made: argparse.ArgumentParser, num_workers: int, ranks: str) -> None:
    """How many ranks (``num_workers`` by default), on which devices, on which Dask cluster."""
    add = made.add_argument
    add("--num-workers", type=positive_int, default=num_workers, help=ranks)
    add("--use-gpu", action="store_true", help="one GPU per rank, NCCL, bf16 autocast")
    add("--compile", action="store_true", help="torch.compile the model on every rank")
    add(
        "--dask-address",
        default=None,
        help="scheduler of an existing Dask cluster (default: $DASK_SCHEDULER_ADDRESS, "
        "else a LocalCluster)",
    )
    add(
        "--dask-cluster-class",
        default=None,
        help="a Dask cluster class to start instead, e.g. dask_jobqueue.SLURMCluster",
    )
    add(
        "--dask-cluster-kwargs",
        type=json_object('\'{"cores": 8, "memory": "32GB"}\''),
        default=None,
        help="the cluster class's keyword arguments as a JSON object",
    )
    add(
        "--dask-worker-timeout-s",
        type=positive_float,
        default=60.0,
        help="how long to wait for enough Dask workers",
    )


def add_registry_options(made: argparse.ArgumentParser) -> None:
    """The MLflow store, the registered model, the promotion rule, the run's system metrics."""
    add_tracking_option(made)
    made.add_argument(
        "--registered-model-name",
        default=None,
        help="the model's name in the MLflow registry (default: cifar10-classifier; "
        "cifar10-classifier-synthetic for a synthetic archive, so it never competes with "
        "models trained on CIFAR-10)",
    )
    made.add_argument(
        "--no-system-metrics",
        dest="system_metrics",
        action="store_false",
        help="do not log CPU, memory and GPU use on the MLflow run",
    )
    made.add_argument(
        "--promote-margin",
        type=number,
        default=0.0,
        help="the accuracy gain over @champion the lower confidence limit must clear",
    )
    made.add_argument(
        "--promote-alpha",
        type=number,
        default=None,
        help="the registered model's lifetime false-promotion budget, fixed by its first version "
        "(default 0.05); later runs spend from it and cannot change it",
    )
    made.add_argument(
        "--min-test-accuracy",
        type=number,
        default=0.0,
        help="release gate: a version below this test accuracy never becomes @champion",
    )
    made.add_argument(
        "--max-class-drop",
        type=number,
        default=0.04,
        help="release gate: a version must show that no class's test accuracy is more than this "
        "below @champion's to replace it (1 turns the gate off)",
    )
    made.add_argument(
        "--check-fresh-load",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="release gate: load the registered model in a new process and check that it "
        "scores test images as the evaluation did",
    )


def add_seed_option(made: argparse.ArgumentParser) -> None:
    """``--seed``: the training's random seed."""
    made.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the initial weights and of the training images' order (recorded on the "
        "run); two seeds give two comparable models of the same data",
    )


def add_tracking_option(made: argparse.ArgumentParser) -> None:
    made.add_argument(
        "--mlflow-tracking-uri",
        default=None,
        help="MLflow server or store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )


def add_model_name_option(made: argparse.ArgumentParser) -> None:
    """predict-cifar's model: the name in the registry."""
    made.add_argument(
        "--registered-model-name",
        default="cifar10-classifier",
        help="the model's name in the MLflow registry",
    )

"""The ``train-cifar``, ``tune-cifar`` and ``predict-cifar`` commands: run the flows locally
with embedded defaults.

Each command parses its options before anything starts (``--help``, ``--version`` and a
mistyped option answer at once). Prefect then runs in its local mode unless PREFECT_API_URL is
set, the Dask cluster is a LocalCluster unless one is named, MLflow is a sqlite file in the
current directory unless one is named, storage is a local folder. A failure prints one
paragraph (what failed, why, what to do) and exits non-zero; the full trace goes to the log
file (``--log-file``; to the terminal too with ``--debug``). Every option's default is the
flow parameter's default (checked by the tests).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from cifar.model_names import MODEL_NAMES
from cli import environment, local_run, options, startup
from cli.synthetic import use_synthetic_archive


def train_parser() -> argparse.ArgumentParser:
    """train-cifar's options: one per parameter of the flow train-cifar, and the command's own."""
    parser = options.parser(
        "train-cifar",
        "Train, register, evaluate and promote a CIFAR-10 classifier "
        "(the Prefect flow train-cifar, run locally).",
    )
    add = parser.add_argument
    options.add_data_options(parser)
    add("--model", choices=MODEL_NAMES, default="small_cnn", help="the network to train")
    add("--epochs", type=options.positive_int, default=5, help="passes over the training split")
    add("--batch-size", type=options.positive_int, default=256, help="global batch size")
    add("--lr", type=options.positive_float, default=0.05, help="peak learning rate (one-cycle)")
    options.add_seed_option(parser)
    options.add_cluster_options(
        parser,
        num_workers=2,
        ranks="DDP ranks (with --use-gpu on a LocalCluster: one per GPU here)",
    )
    options.add_registry_options(parser)
    add(
        "--predict-input",
        default=None,
        help="images to score with the champion afterwards (a folder, an image or a batch file)",
    )
    add(
        "--run-name",
        default=None,
        help="name of the training run; the same name and storage path resume it "
        "(default: one per flow run)",
    )
    add(
        "--force",
        action="store_true",
        help="train even when nothing would change (the champion's data, code and options)",
    )
    options.add_run_options(parser, "train-cifar", timeout_minutes=1440.0)
    return parser


def tune_parser() -> argparse.ArgumentParser:
    """tune-cifar's options: one per parameter of the flow tune-cifar, and the command's own."""
    parser = options.parser(
        "tune-cifar",
        "Search hyperparameters of a CIFAR-10 classifier, then register, evaluate and promote "
        "the best trial (the Prefect flow tune-cifar, run locally).",
    )
    add = parser.add_argument
    options.add_data_options(parser)
    add(
        "--search-space",
        type=options.json_object('\'{"lr": ["loguniform", 0.01, 0.3]}\''),
        default=None,
        help="TrainConfig fields to search, as JSON: {field: [kind, args...]}, kind one of "
        "uniform, loguniform, quniform, randint, choice, grid_search (default: lr "
        "log-uniform in [0.01, 0.3] and batch size 128 or 256, model small_cnn)",
    )
    add("--num-samples", type=options.positive_int, default=8, help="trials")
    add(
        "--max-concurrent-trials",
        type=options.positive_int,
        default=2,
        help="trials running at once (each needs --num-workers Dask workers)",
    )
    add("--epochs", type=options.positive_int, default=5, help="epochs of a trial run to the end")
    options.add_seed_option(parser)
    options.add_cluster_options(parser, num_workers=1, ranks="DDP ranks per trial")
    options.add_registry_options(parser)
    add(
        "--run-name",
        default=None,
        help="name of the search; the same name and storage path resume it "
        "(default: one per flow run)",
    )
    add(
        "--study-storage",
        default=None,
        help="Optuna storage URL, e.g. postgresql://... (default: sqlite under --storage-path; "
        "needed with s3:// storage)",
    )
    options.add_run_options(parser, "tune-cifar", timeout_minutes=2880.0)
    return parser


def predict_parser() -> argparse.ArgumentParser:
    """predict-cifar's options: one per parameter of the flow predict-cifar, and --debug."""
    parser = options.parser(
        "predict-cifar",
        "Score images with a registered CIFAR-10 classifier (the Prefect flow predict-cifar, run "
        "locally). Unreadable images go to OUTPUT's .errors.csv.",
    )
    add = parser.add_argument
    add("input", help="a folder of PNG/JPEG images, one image, or a CIFAR batch file (any URL)")
    add("--output", default="predictions.csv", help="CSV, or Parquet if it ends in .parquet")
    options.add_model_name_option(parser)
    add("--alias", default="champion", help="the model's alias to score with")
    options.add_tracking_option(parser)
    options.add_run_options(parser, "predict-cifar", timeout_minutes=1440.0)
    return parser


# Each command imports its flow (and with it Prefect, torch, MLflow) only after its options are
# parsed and the local Prefect server is starting: the two overlap.


def main(argv: list[str] | None = None) -> int:
    """Run train-cifar; returns the exit status (0, or 1 after an error, 130 after Ctrl-C)."""

    def flow() -> Callable[..., dict[str, Any]]:
        from flows.train_cifar import train_cifar

        return train_cifar

    return _train("train-cifar", train_parser(), flow, argv)


def tune_main(argv: list[str] | None = None) -> int:
    """Run tune-cifar (the flow, locally); returns the exit status as ``main`` does."""

    def flow() -> Callable[..., dict[str, Any]]:
        from flows.tune_cifar import tune_cifar

        return tune_cifar

    return _train("tune-cifar", tune_parser(), flow, argv)


def predict_main(argv: list[str] | None = None) -> int:
    """Run predict-cifar (the flow, locally); returns the exit status as ``main`` does."""
    params = _parse(predict_parser(), argv)
    debug, log_file = params.pop("debug"), params.pop("log_file")
    server = startup.start_local_server()
    from flows.predict_cifar import predict_cifar

    def run() -> dict[str, Any]:
        startup.use(server)
        return predict_cifar(**params)

    return local_run.run_command(
        "predict-cifar", run, log_file=log_file, debug=debug, exits=argv is None
    )


def _train(
    command: str,
    parser: argparse.ArgumentParser,
    load_flow: Callable[[], Callable[..., dict[str, Any]]],
    argv: list[str] | None,
) -> int:
    """Run the flow ``command`` (train-cifar or tune-cifar) with the options in ``argv``."""
    params = _parse(parser, argv)
    if command == "train-cifar":
        params["num_workers"] = _one_rank_per_gpu(train_parser(), argv) or params["num_workers"]
    synthetic, debug, log_file = (params.pop(key) for key in ("synthetic", "debug", "log_file"))
    server = startup.start_local_server()  # its start-up overlaps the flow's imports
    flow = load_flow()

    def run() -> dict[str, Any]:
        if synthetic:
            use_synthetic_archive(params, command)
        startup.use_while_preparing_mlflow(server, params["mlflow_tracking_uri"])
        return flow(**params)

    exits = argv is None
    return local_run.run_command(command, run, log_file=log_file, debug=debug, exits=exits)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> dict[str, Any]:
    """The options as the flow's parameters, with the environment set for Prefect."""
    params = vars(parser.parse_args(argv))
    environment.set_environment()
    return params


def _one_rank_per_gpu(parser: argparse.ArgumentParser, argv: list[str] | None) -> int | None:
    """With --use-gpu, no --num-workers and no Dask cluster given, one rank per GPU of this
    machine (the default 2 fails on a 1-GPU machine); None otherwise."""
    parser.set_defaults(num_workers=None)  # parsed again: tells a default from a choice
    again = parser.parse_args(argv)
    if not again.use_gpu or again.num_workers is not None:
        return None
    import dask

    if again.dask_address or again.dask_cluster_class or dask.config.get("scheduler-address", None):
        return None
    import torch

    return torch.cuda.device_count() or None


if __name__ == "__main__":
    sys.exit(main())

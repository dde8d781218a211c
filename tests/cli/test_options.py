"""The commands' options, without running a flow: defaults, spellings, errors in plain words."""

from __future__ import annotations

import argparse
import inspect
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from cli import commands, console
from flows.predict_cifar import predict_cifar
from flows.train_cifar import train_cifar
from flows.tune_cifar import tune_cifar

COMMAND_ONLY = {"help", "version", "synthetic", "debug", "log_file"}


def _options(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Each option's destination and default, as the command passes them to the flow."""
    return {
        action.dest: action.default
        for action in parser._actions
        if action.dest not in COMMAND_ONLY and action.default is not argparse.SUPPRESS
    }


@pytest.mark.parametrize(
    ("parser", "flow"),
    [
        (commands.train_parser, train_cifar.fn),
        (commands.tune_parser, tune_cifar.fn),
        (commands.predict_parser, predict_cifar.fn),
    ],
    ids=["train-cifar", "tune-cifar", "predict-cifar"],
)
def test_every_flow_parameter_is_an_option_of_the_same_name_with_the_flows_default(
    parser: Callable[[], argparse.ArgumentParser],
    flow: Callable[..., Any],
) -> None:
    options = _options(parser())
    parameters = inspect.signature(flow).parameters
    assert set(options) == set(parameters)
    defaults = {n: p.default for n, p in parameters.items() if p.default is not p.empty}
    assert {name: options[name] for name in defaults} == defaults


@pytest.mark.parametrize(
    "parser", [commands.train_parser, commands.tune_parser, commands.predict_parser]
)
def test_help_shows_each_options_default(parser: Callable[[], argparse.ArgumentParser]) -> None:
    text = parser().format_help().split("\noptions:\n")[1]
    for action in parser()._actions:
        if action.option_strings and action.nargs != 0 and action.help != argparse.SUPPRESS:
            entry = text[text.index(action.option_strings[-1]) :]
            assert "(default" in entry.split("\n  -")[0], action.option_strings


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        commands.train_parser().parse_args(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == "train-cifar 0.1.0"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--dask-cluster-kwargs", "{bad"],
            "argument --dask-cluster-kwargs: expected a JSON object such as "
            '\'{"cores": 8, "memory": "32GB"}\', got \'{bad\' (Expecting property name '
            "enclosed in double quotes at character 2)",
        ),
        (
            ["--dask-cluster-kwargs", "[1]"],
            'expected a JSON object such as \'{"cores": 8, "memory": "32GB"}\', got list \'[1]\'',
        ),
        (
            ["--epochs", "zero"],
            "argument --epochs: expected a whole number of at least 1, got 'zero'",
        ),
        (["--num-workers", "0"], "expected a whole number of at least 1, got '0'"),
        (["--lr", "-1"], "argument --lr: expected a number above 0, got '-1'"),
        (
            ["--model", "vit"],
            "argument --model: invalid choice: 'vit' (choose from 'small_cnn', 'resnet18')",
        ),
        (["--epoch", "2"], "unrecognized arguments: --epoch 2"),
    ],
)
def test_a_wrong_option_says_what_was_expected(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        commands.train_parser().parse_args(args)
    assert exit.value.code == 2
    assert expected in capsys.readouterr().err


def test_tune_search_space_must_be_a_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        commands.tune_parser().parse_args(["--search-space", '["lr"]'])
    assert "--search-space: expected a JSON object such as" in capsys.readouterr().err


@pytest.mark.integration  # starts a process (tests/process_guard.py)
@pytest.mark.parametrize("command", ["main", "tune_main", "predict_main"])
def test_a_mistyped_option_fails_before_prefect_is_imported(command: str) -> None:
    code = (
        "import sys\n"
        f"from cli.commands import {command}\n"
        "try:\n"
        f"    {command}(['in/', '--no-such-option'])\n"
        "except SystemExit as exit:\n"
        "    print(exit.code, 'prefect' in sys.modules, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert "error: unrecognized arguments:" in done.stderr and "--no-such-option" in done.stderr


def test_the_log_file_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "LOG_FILE_MAX_BYTES", 2000)
    log_file = tmp_path / "logs" / "train-cifar.log"
    with console.console_logging(log_file, debug=False):
        for line in range(100):
            logging.getLogger("cifar").info("line %d of a long run", line)
    assert log_file.stat().st_size <= 2000
    assert (tmp_path / "logs" / "train-cifar.log.1").stat().st_size <= 2000
    assert "line 99 of a long run" in log_file.read_text()
    assert len(list((tmp_path / "logs").iterdir())) == 2


def test_train_gpu_runs_default_to_one_rank_per_gpu_of_a_local_cluster() -> None:
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) or None
    parser = commands.train_parser
    assert commands._one_rank_per_gpu(parser(), ["--use-gpu"]) == gpus
    assert commands._one_rank_per_gpu(parser(), ["--use-gpu", "--num-workers", "2"]) is None
    assert (
        commands._one_rank_per_gpu(parser(), ["--use-gpu", "--dask-address", "tcp://s:1"]) is None
    )
    assert commands._one_rank_per_gpu(parser(), []) is None
    assert "one per GPU here" in " ".join(parser().format_help().split())

"""The ranks' messages to the driver as JSON: generated messages come back equal, generated
hostile items (pickles, wrong types, missing or extra fields) are refused without running code,
and reported values become JSON data."""

from __future__ import annotations

import json
import logging
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainlib._internal.common import wire
from trainlib._internal.common.commit_marker import FileEntry
from trainlib._internal.common.messages import (
    CheckpointsQuery,
    DriverMessage,
    RankLog,
    RankStarted,
    ReportMessage,
)
from trainlib.errors import ControllerError


def _text(rng: random.Random) -> str:
    alphabet = "abc xyz_/.-é漢\n\"'\\{}[]%s"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(7 if depth < 3 else 5)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.randint(-(2**70), 2**70)
    if pick == 3:
        return rng.uniform(-1e9, 1e9)
    if pick == 4:
        return _text(rng)
    if pick == 5:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _message(rng: random.Random) -> DriverMessage:
    kind = rng.randrange(4)
    rank, index = rng.randint(0, 512), rng.randint(0, 10**6)
    if kind == 0:
        return RankStarted(rank, _text(rng), rng.randint(1, 2**22), _text(rng))
    if kind == 1:
        files = None
        if rng.random() < 0.7:
            files = {_text(rng): FileEntry(rng.randint(0, 2**40), f"{rng.getrandbits(256):064x}")}
        metrics = {_text(rng): _json_value(rng) for _ in range(rng.randint(0, 4))}
        return ReportMessage(
            rank,
            index,
            metrics if rng.random() < 0.8 else None,
            files,
            rng.choice([None, _text(rng)]),
            rng.choice([None, {}, {"split": _text(rng), "n": rng.randint(0, 9)}]),
        )
    if kind == 2:
        return CheckpointsQuery(rank, index, rng.random() < 0.5)
    record = logging.LogRecord(
        _text(rng) or "trainlib", rng.choice([10, 20, 30, 40]), "/x.py", rng.randint(1, 999),
        "step %d: %s", (rng.randint(0, 9), _text(rng)), None,
    )  # fmt: skip
    return RankLog(record)


def _same(sent: DriverMessage, received: DriverMessage) -> None:
    if isinstance(sent, RankLog):
        assert isinstance(received, RankLog)
        for name in ("name", "levelno", "levelname", "lineno", "created", "process"):
            assert getattr(received.record, name) == getattr(sent.record, name)
        assert received.record.getMessage() == sent.record.getMessage()
    else:
        assert received == sent


@pytest.mark.parametrize("seed", range(4))
def test_generated_messages_come_back_equal(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        message = _message(rng)
        text = wire.encode(message)
        assert isinstance(text, str)
        _same(message, wire.decode(text))


class _Planted:
    """A pickle that writes a file when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.path, "ran"))


def _hostile(rng: random.Random, planted: Path) -> object:
    """An item a worker that is not ours might put on the queue."""
    good = json.loads(wire.encode(_message(rng)))
    way = rng.randrange(9)
    if way == 0:
        return pickle.dumps(_Planted(planted))  # bytes: what the queue carried before
    if way == 1:
        return pickle.dumps(_Planted(planted)).decode("latin-1")
    if way == 2:
        return json.dumps(_json_value(rng))[: rng.randint(0, 40)] or "["
    if way == 3:
        good["type"] = rng.choice(["RankFailure", "Command", "", None, 3, "__main__.Planted"])
    elif way == 4:
        del good[rng.choice([k for k in good if k != "type"])]
    elif way == 5:
        good[rng.choice(["extra", "__reduce__", "py/object"])] = _json_value(rng)
    elif way == 6:
        key = rng.choice([k for k in good if k != "type"])
        good[key] = rng.choice([[1], {"a": 1}, "7", 1.5, True]) if good[key] is not None else [0]
    elif way == 7:
        return json.dumps([good])
    else:
        return rng.choice([None, 3, 2.5, {"type": "RankStarted"}, ["RankStarted"]])
    return json.dumps(good)


def _still_valid(item: object) -> bool:
    """A mutation that happens to leave a valid message (e.g. a str field set to "7")."""
    try:
        wire.decode(item)
    except wire.WireError:
        return False
    return True


@pytest.mark.parametrize("seed", range(4))
def test_generated_hostile_items_are_refused_and_run_nothing(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    planted = tmp_path / "planted"
    refused = 0
    for _ in range(150):
        item = _hostile(rng, planted)
        if isinstance(item, str) and _still_valid(item):
            continue
        with pytest.raises(wire.WireError, match="not one trainlib's ranks send") as caught:
            wire.decode(item)
        assert isinstance(caught.value, ControllerError)
        assert "Give every worker the driver's trainlib release" in str(caught.value)
        refused += 1
    assert refused >= 120
    assert not planted.exists()


def test_a_boolean_is_not_a_number_nor_a_number_a_boolean() -> None:
    query = json.loads(wire.encode(CheckpointsQuery(0, 3, True)))
    for field, value in (("index", True), ("validated", 1), ("world_rank", 1.0)):
        with pytest.raises(wire.WireError, match=field):
            wire.decode(json.dumps({**query, field: value}))


def test_reported_values_become_json_data() -> None:
    metrics = {
        "loss": np.float32(0.25),
        "step": np.int64(3),
        "acc": torch.tensor(0.5),
        "per_class": torch.tensor([1.0, 2.0]),
        "grid": np.arange(4).reshape(2, 2),
        "pair": (1, "a"),
        "nested": {"lr": np.float64(0.1), "path": Path("/tmp/x")},
    }
    plain = wire.plain(metrics, where="report(metrics)")
    assert plain == {
        "loss": 0.25,
        "step": 3,
        "acc": 0.5,
        "per_class": [1.0, 2.0],
        "grid": [[0, 1], [2, 3]],
        "pair": [1, "a"],
        "nested": {"lr": 0.1, "path": str(Path("/tmp/x"))},
    }
    assert json.loads(json.dumps(plain)) == plain
    with pytest.raises(TypeError, match=r"report\(metrics\)\['nested'\]\['path'\] is a PosixPath"):
        wire.plain(metrics, where="report(metrics)", strict=True)
    with pytest.raises(TypeError, match="keys must be str"):
        wire.plain({"a": {1: 2}}, where="x")

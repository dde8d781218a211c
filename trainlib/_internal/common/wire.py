"""The ranks' messages to the driver as JSON text: what crosses from a Dask worker to the
driver's process is data, never a pickle.

A supervisor puts ``encode(message)`` on the run's Dask queue; the driver's mailbox turns each
item back with ``decode``, which accepts only the ``DriverMessage`` types with their fields of
the right types and raises ``WireError`` for anything else (a worker of another trainlib
release, or one that was taken over: Dask's queue carries msgpack data, so such an item cannot
run code in the driver). Values a rank reports (metrics, a validation's arguments) are made
JSON data where they are made (``plain``), so every front end sees the same values.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from trainlib._internal.common.commit_marker import FileEntry
from trainlib._internal.common.messages import (
    CheckpointsQuery,
    DriverMessage,
    RankLog,
    RankStarted,
    ReportMessage,
)
from trainlib.errors import ControllerError

# A log record's attributes that travel (``QueueHandler.prepare`` already merged the message,
# its arguments and its traceback into ``msg``); anything else a record carries stays behind.
_RECORD_TEXT = (
    *("name", "msg", "levelname", "pathname", "filename", "module", "funcName"),
    *("threadName", "processName", "taskName"),
)
_RECORD_NUMBERS = ("levelno", "lineno", "created", "msecs", "relativeCreated", "thread", "process")


class WireError(ControllerError):
    """An item on the ranks' queue that is not a message this trainlib sends."""


def plain(value: Any, *, where: str, strict: bool = False) -> Any:
    """``value`` as JSON data: numpy and torch values become numbers or lists, tuples lists;
    another object becomes its ``str()`` (as Ray Tune writes results), or with ``strict``
    raises ``TypeError`` naming ``where`` it was found."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}: keys must be str (JSON's)")
            out[key] = plain(item, where=f"{where}[{key!r}]", strict=strict)
        return out
    if isinstance(value, (list, tuple)):
        return [plain(item, where=f"{where}[{i}]", strict=strict) for i, item in enumerate(value)]
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays, torch tensors
    if callable(tolist):
        return plain(tolist(), where=where, strict=strict)
    if strict:
        raise TypeError(
            f"{where} is a {type(value).__name__}: it travels to the driver as JSON; pass "
            "numbers, strings, booleans, None, lists or dicts of them (e.g. a path, not an object)"
        )
    return str(value)


def encode(message: DriverMessage) -> str:
    """The JSON text of a message a rank sends the driver."""
    fields: dict[str, Any]
    if isinstance(message, RankStarted):
        fields = {
            "world_rank": message.world_rank,
            "host": message.host,
            "pid": message.pid,
            "batch_job": message.batch_job,
        }
    elif isinstance(message, ReportMessage):
        files = message.files
        fields = {
            "world_rank": message.world_rank,
            "index": message.index,
            "metrics": message.metrics,
            "files": None if files is None else {k: [e.size, e.sha256] for k, e in files.items()},
            "dir_name": message.dir_name,
            "validation": message.validation,
        }
    elif isinstance(message, CheckpointsQuery):
        fields = {
            "world_rank": message.world_rank,
            "index": message.index,
            "validated": message.validated,
        }
    else:
        record = message.record
        fields = {name: getattr(record, name, None) for name in _RECORD_TEXT + _RECORD_NUMBERS}
        fields["msg"] = record.getMessage()
    return json.dumps({"type": type(message).__name__, **fields})


def decode(item: object) -> DriverMessage:
    """The message in one item of the ranks' queue.

    Raises:
        WireError: ``item`` is not the JSON text of a ``DriverMessage`` with fields of the
            right types.
    """
    try:
        if not isinstance(item, str):
            raise ValueError(f"a {type(item).__name__}, not JSON text")
        value = json.loads(item)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        kind = value.pop("type", None)
        if kind not in _DECODERS:
            raise ValueError(f"no message type {kind!r}")
        return _DECODERS[kind](_Fields(value))
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(
            f"A message on the run's queue is not one trainlib's ranks send ({exc}; it began "
            f"{str(item)[:80]!r}): a Dask worker of this cluster runs another trainlib release "
            "or is not ours. Give every worker the driver's trainlib release and restart them."
        ) from None


class _Fields:
    """A message's fields, each taken once with its type checked; none may be left over."""

    def __init__(self, value: dict[str, Any]) -> None:
        self._value = value

    def take(self, name: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
        if name not in self._value:
            raise KeyError(f"no field {name!r}")
        field = self._value.pop(name)
        if field is None and optional:
            return None
        # a bool is an int to Python, not to JSON; a whole float arrives as one
        wrong_bool = isinstance(field, bool) and bool not in _kinds(kind)
        if wrong_bool or not isinstance(field, kind):
            raise TypeError(f"field {name!r} is {field!r}")
        return field

    def done(self, message: DriverMessage) -> DriverMessage:
        if self._value:
            raise ValueError(f"unknown fields {sorted(self._value)}")
        return message


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _rank_started(f: _Fields) -> DriverMessage:
    world_rank, host, pid = f.take("world_rank", int), f.take("host", str), f.take("pid", int)
    return f.done(RankStarted(world_rank, host, pid, f.take("batch_job", str)))


def _report(f: _Fields) -> DriverMessage:
    world_rank, index = f.take("world_rank", int), f.take("index", int)
    metrics = f.take("metrics", dict, optional=True)
    files = f.take("files", dict, optional=True)
    entries = None
    if files is not None:
        entries = {}
        for rel, entry in files.items():
            size, sha256 = entry  # a two-item list
            if not isinstance(size, int) or isinstance(size, bool) or not isinstance(sha256, str):
                raise TypeError(f"file entry {rel!r} is {entry!r}")
            entries[rel] = FileEntry(size, sha256)
    dir_name = f.take("dir_name", str, optional=True)
    validation = f.take("validation", dict, optional=True)
    return f.done(ReportMessage(world_rank, index, metrics, entries, dir_name, validation))


def _query(f: _Fields) -> DriverMessage:
    world_rank, index = f.take("world_rank", int), f.take("index", int)
    return f.done(CheckpointsQuery(world_rank, index, f.take("validated", bool)))


def _log(f: _Fields) -> DriverMessage:
    attributes = {name: f.take(name, str, optional=True) for name in _RECORD_TEXT}
    for name in _RECORD_NUMBERS:
        whole = name in ("levelno", "lineno", "thread", "process")
        number = f.take(name, int if whole else (int, float), optional=True)
        if isinstance(number, float) and not math.isfinite(number):
            raise ValueError(f"field {name!r} is {number!r}")
        attributes[name] = number
    if attributes["name"] is None or attributes["levelno"] is None:
        raise ValueError("a log record without a logger name or level")
    return f.done(RankLog(logging.makeLogRecord(attributes)))


_DECODERS: dict[str, Callable[[_Fields], DriverMessage]] = {
    "RankStarted": _rank_started,
    "ReportMessage": _report,
    "CheckpointsQuery": _query,
    "RankLog": _log,
}

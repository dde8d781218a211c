"""What the commands print: one line per log record, one paragraph per
error.

The terminal gets no tracebacks (``--debug`` brings them back); the log file gets everything.
Prefect's own "task failed" and "flow failed" records repeat the error the command explains
at the end, so the terminal skips them; the file keeps them.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
from collections.abc import Iterator
from pathlib import Path

from cifar.errors import PipelineError
from trainlib import ClusterError, ConfigError, DatasetError, WorkerGroupError

TRACE_LOGGER = "cli.trace"
LOG_FILE_MAX_BYTES = 10 * 2**20  # then the file moves to <name>.1 and a new one starts
_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
_EXPLAINED_BY_THEIR_MESSAGE = (
    ClusterError,
    DatasetError,
    ConfigError,
    PermissionError,
    FileNotFoundError,
)
_OWN_LOGGERS = ("trainlib", "cifar", "mlops", "tasks", "train-cifar", "predict-cifar", "mlflow")


class _WithoutTraceback(logging.Formatter):
    """Formats a copy of the record without its traceback, through another formatter."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            record = logging.makeLogRecord(record.__dict__)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return self._inner.format(record)


def _not_a_run_failure(record: logging.LogRecord) -> bool:
    """False for Prefect's records of a failed task or flow run (the error paragraph says it),
    and for its workers' "still processing items" notes while the process exits."""
    if record.name in ("EventsWorker", "APILogWorker"):
        return record.levelno >= logging.ERROR
    if not record.name.startswith(_RUN_LOGGERS):
        return True
    message = record.getMessage()
    failed = "state Failed" in message or "state Crashed" in message
    return record.levelno < logging.ERROR and not failed


@contextlib.contextmanager
def console_logging(log_file: Path, *, debug: bool) -> Iterator[None]:
    """Levels for the pipeline's loggers, a quiet terminal, and the full log in ``log_file``;
    everything is as it was again afterwards (the command can run in a caller's process)."""
    levels = {name: logging.getLogger(name).level for name in _OWN_LOGGERS}
    for name in _OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if name == "mlflow" else logging.INFO)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.handlers.RotatingFileHandler(
        log_file, maxBytes=LOG_FILE_MAX_BYTES, backupCount=1
    )
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    quieted: list[tuple[logging.Handler, logging.Formatter]] = []
    if not debug:
        for handler in root.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.formatter is not None:
                quieted.append((handler, handler.formatter))
                handler.setFormatter(_WithoutTraceback(handler.formatter))
                handler.addFilter(_not_a_run_failure)
    root.addHandler(file_handler)
    trace = logging.getLogger(TRACE_LOGGER)
    trace.propagate = False
    trace.addHandler(file_handler)
    try:
        yield
    finally:
        trace.removeHandler(file_handler)
        root.removeHandler(file_handler)
        file_handler.close()
        for handler, formatter in quieted:
            handler.setFormatter(formatter)
            handler.removeFilter(_not_a_run_failure)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def explain(error: BaseException, log_file: Path, command: str = "train-cifar") -> str:
    """One paragraph for the user: what failed, the cause in plain words, what to do."""
    logging.getLogger(TRACE_LOGGER).error("failed", exc_info=error)
    details = f"(Full details: {log_file}; --debug prints them here.)"
    if isinstance(error, KeyboardInterrupt):
        return f"Interrupted (Ctrl-C): {command} stopped; none of its processes is left running."
    if isinstance(error, PipelineError):
        return f"{error} {details}"
    if isinstance(error, WorkerGroupError):
        root = error.root_cause
        kind, _, message = root.summary.partition(": ")
        if kind in _pipeline_error_names():
            return f"{message} {details}"
        return (
            f"Training failed: rank {root.world_rank} on {root.host}: {root.summary}. Fix the "
            f"cause shown in the traceback {details}"
        )
    if isinstance(error, _EXPLAINED_BY_THEIR_MESSAGE):
        return f"{error} {details}"
    return (
        f"{command} failed: {type(error).__name__}: {error}. This was not expected; the "
        f"traceback shows where {details}"
    )


def _pipeline_error_names() -> set[str]:
    found: set[str] = set()
    pending: list[type[BaseException]] = [PipelineError]
    while pending:
        kind = pending.pop()
        found.add(kind.__name__)
        pending.extend(kind.__subclasses__())
    return found

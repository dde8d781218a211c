"""What a Prefect server has recorded of a run, read once it has recorded what a test needs.

Prefect 3 does not write task runs through the API. The engine keeps a task run in memory and
emits each of its states as an event (``prefect.task_engine``: ``set_state`` calls
``emit_task_run_state_change_event``); a background thread of the client sends the events to the
server, and the server's task-run recorder writes them to the database afterwards (a row keeps
the state with the latest timestamp; a write that fails, as SQLite's "database is locked" does,
is tried again on the recorder's next periodic flush, every 5 s). The flow run's own final
state is set through the API, before that. Logs travel the same way (a batching thread, drained when
the process exits). So a read right after a flow returns can see a task run still ``Pending`` or
``Running``, not yet there at all, or a log line still missing.

These helpers poll the server until the records a test needs are there, with a bound, and then
return what they read: at the bound, whatever is recorded, for the test's assertion to show.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, Log, TaskRun

RECORD_TIMEOUT_S = 60.0  # the recorder retries a failed write every 5 s, five times
POLL_S = 0.2
LOGS_PER_CALL = 200  # the API's most

T = TypeVar("T")


def _poll(read: Callable[[], T], done: Callable[[T], bool], timeout: float) -> T:
    """``read()`` until ``done`` holds of what it read or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(POLL_S)  # polling the server for a record, not waiting out a delay
        value = read()
    return value


def task_runs(
    flow_run_id: Any, names: Iterable[str], timeout: float = RECORD_TIMEOUT_S
) -> dict[str, TaskRun]:
    """Task name → task run of a flow run, once every task in ``names`` has a recorded task
    run in a final state (``Completed``, ``Cached``, ``Failed``, ...)."""
    wanted = set(names)

    async def read_async() -> dict[str, TaskRun]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
        return {run.name.rsplit("-", 1)[0]: run for run in runs}

    def done(runs: dict[str, TaskRun]) -> bool:
        return all(
            name in runs and (state := runs[name].state) is not None and state.is_final()
            for name in wanted
        )

    return _poll(lambda: asyncio.run(read_async()), done, timeout)


def task_run_states(
    flow_run_id: Any, names: Iterable[str], timeout: float = RECORD_TIMEOUT_S
) -> dict[str, str]:
    """Task name → state name (``Completed``, ``Cached``, ...), as :func:`task_runs` reads them."""
    runs = task_runs(flow_run_id, names, timeout)
    return {name: run.state_name or "" for name, run in runs.items()}


def final_flow_runs(flow_run_ids: list[Any], timeout: float) -> list[FlowRun]:
    """The flow runs, once each is in a final state (or at ``timeout``)."""

    async def read_async() -> list[FlowRun]:
        async with get_client() as client:
            return [await client.read_flow_run(i) for i in flow_run_ids]

    return _poll(
        lambda: asyncio.run(read_async()),
        lambda runs: all(r.state is not None and r.state.is_final() for r in runs),
        timeout,
    )


def flow_run_logs(
    flow_run_id: Any,
    until: Callable[[list[Log]], bool],
    timeout: float = RECORD_TIMEOUT_S,
) -> list[Log]:
    """Every log record of a flow run, once ``until(logs)`` holds (or at ``timeout``)."""

    async def read_async() -> list[Log]:
        found: list[Log] = []
        async with get_client() as client:
            while True:
                logs = await client.read_logs(
                    log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                    limit=LOGS_PER_CALL,
                    offset=len(found),
                )
                if not logs:
                    return found
                found += logs

    return _poll(lambda: asyncio.run(read_async()), until, timeout)


def flow_finished(logs: list[Log]) -> bool:
    """Whether the flow run's own last line (the engine's "Finished in state ...") is recorded:
    the flow run logs nothing after it."""
    return any(
        log.task_run_id is None and log.message.startswith("Finished in state") for log in logs
    )

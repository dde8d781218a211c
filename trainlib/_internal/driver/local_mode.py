"""Local mode (``ScalingConfig(num_workers=0)``, as Ray Train's): the run's controller, with a
placement that needs no Dask cluster and a group of one rank whose training function runs in
the calling thread of the driver's process, when the group is first polled, with no process
group. ``report``, ``get_context`` and checkpoints work as in a rank: a world of one, rank 0,
its reports committed by the run's own collector as they are made; ``get_dataset_shard`` reads
the datasets here (``local_feed``). For debugging (a breakpoint in the training function stops
where it is). A failure is decided on as any run's (``FailureConfig``)."""

from __future__ import annotations

import functools
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import cloudpickle

from trainlib._internal.common.messages import (
    DataBlock,
    DataRequest,
    DriverMessage,
    RankMessage,
    RankSpec,
    ToRank,
)
from trainlib._internal.driver.group_status import GroupStatus
from trainlib._internal.driver.local_feed import Deliver, LocalFeed
from trainlib._internal.driver.ranks import WorkerSlot
from trainlib._internal.rank.process_globals import RANK
from trainlib._internal.rank.session import Session
from trainlib.errors import ConfigError, RankFailure

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from trainlib._internal.driver.run_plan import RunPlan
    from trainlib._internal.driver.worker_group import LaunchBuilder, MessageHandler


LOCAL = "local"  # the "worker" address of the one rank


class LocalPlacement:
    """The run of ``plan`` here: no cluster, no GPU claims, one rank in this thread."""

    def __init__(self, plan: RunPlan) -> None:
        self._plan = plan

    @contextmanager
    def connect(self, plan: RunPlan, client: Any) -> Iterator[None]:
        """No cluster (``client`` is not used).

        Raises:
            ConfigError: This thread runs a rank already.
        """
        if RANK.session is not None:
            raise ConfigError(
                "ScalingConfig(num_workers=0) inside a training function: a rank already runs "
                "here; use num_workers=1 or more for a run started from a rank."
            )
        yield None

    def claims(self, client: Any, owner: str) -> AbstractContextManager[None]:
        """No GPUs claimed: the function uses this process's devices."""
        return nullcontext()

    def select(
        self, client: Any, plan: RunPlan, unresponsive: Any, poll: Any, claims: Any
    ) -> list[WorkerSlot]:
        """The one slot: rank 0 on this host."""
        host = socket.gethostname()
        return [
            WorkerSlot(LOCAL, host, world_rank=0, local_rank=0, local_world_size=1, node_rank=0)
        ]

    def start(
        self,
        client: Any,
        slots: list[WorkerSlot],
        build: LaunchBuilder,
        handle: MessageHandler,
        resources: Any,
    ) -> AbstractContextManager[LocalGroup]:
        """The group of the one slot; nothing runs until it is polled."""
        (slot,) = slots
        spec: RankSpec = cloudpickle.loads(build(slot, slot.host, 0).spec_payload)
        feed = functools.partial(
            LocalFeed, self._plan.datasets, self._plan.data_config.shuffle_seed
        )
        return nullcontext(LocalGroup(slot, spec, feed, handle))


class LocalGroup:
    """One rank whose training function runs here, to its end, at the first poll."""

    size = 1

    def __init__(
        self,
        slot: WorkerSlot,
        spec: RankSpec,
        feed: Callable[[Deliver], LocalFeed],
        handle: MessageHandler,
    ) -> None:
        self._slot = slot
        self._spec = spec
        self._feed = feed
        self._handle = handle
        self._failures: dict[int, RankFailure] = {}
        self._ended = False
        self._session: Session | None = None
        self.unresponsive_workers: set[str] = set()

    def poll(self, timeout_s: float) -> GroupStatus:
        """Run the training function here (the first time), then say how it ended; what the
        controller raised while handling a report is raised here."""
        if not self._ended:
            self._ended = True
            try:
                self._run()
            except _DriverError as driver_side:  # a callback stopped the run, as it would any
                raise driver_side.error from None
            except Exception as exc:
                self._failures[0] = _failure(self._slot.host, exc)
        return self.status()

    def status(self, stopped: bool = False) -> GroupStatus:
        ended = frozenset({0}) if self._ended else frozenset()
        return GroupStatus(1, ended, dict(self._failures), stopped=stopped)

    def fail(self, failures: dict[int, RankFailure]) -> GroupStatus:
        """A function that ended cannot hang: nothing changes."""
        return self.status()

    def stop(self) -> GroupStatus:
        """Nothing runs between polls: the status, final."""
        self._ended = True
        return self.status(stopped=True)

    def send(self, message: ToRank) -> None:
        self.send_to(0, message)

    def send_to(self, world_rank: int, message: ToRank) -> None:
        if self._session is not None:
            self._session.deliver(message)

    def _run(self) -> None:
        spec = self._spec
        feed: LocalFeed | None = None
        session = Session(spec, lambda message: _relay(self._handle, feed, message))
        feed = self._feed(
            lambda name, pass_id, block: session.deliver(DataBlock(name, pass_id, block))
        )
        self._session = session
        RANK.start(session)
        try:
            if spec.setup_payload is not None:
                cloudpickle.loads(spec.setup_payload)()
            cloudpickle.loads(spec.train_func_payload)()
            session.uploads.wait()
        except Exception:  # not a _DriverError: the controller's, raised by poll
            session.uploads.abandon()
            raise
        finally:
            RANK.reset()
            self._session = None


def _failure(host: str, exc: Exception) -> RankFailure:
    return RankFailure(
        0,
        host,
        "exception",
        f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc)),
        time=time.time(),
    )


class _DriverError(BaseException):
    """What the run's collector or a callback raised while handling a report, carried out
    through the training function (a BaseException, so its ``except Exception`` lets it by)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _relay(
    handle: Callable[[DriverMessage], None], feed: LocalFeed | None, message: RankMessage
) -> None:
    """A message of the training function, handled as the driver handles a rank's (the
    session sends one at a time); its logs are this process's own already."""
    if isinstance(message, DataRequest) and feed is not None:
        feed.request(message.dataset, message.pass_id)
        return
    if isinstance(message, DriverMessage):
        try:
            handle(message)
        except Exception as exc:
            raise _DriverError(exc) from exc

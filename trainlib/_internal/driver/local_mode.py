"""Local mode (``ScalingConfig(num_workers=0)``, as Ray Train's): the training function runs
once, in the calling thread of the driver's process, with no Dask cluster and no process group.
``report``, ``get_context`` and checkpoints work as in a rank: a world of one, rank 0, its
reports committed by the run's own collector as they are made; ``get_dataset_shard`` reads
the datasets here (``local_feed``). For debugging (a breakpoint in the training function stops
where it is)."""

from __future__ import annotations

import socket
import time
import traceback
from typing import TYPE_CHECKING

import cloudpickle

from trainlib._internal.common.messages import (
    DataBlock,
    DataRequest,
    DriverMessage,
    RankMessage,
    RankSpec,
    ToRank,
)
from trainlib._internal.driver.controller_callbacks.user_callbacks import UserCallbacks
from trainlib._internal.driver.controller_state import Running
from trainlib._internal.driver.local_feed import LocalFeed
from trainlib._internal.driver.ranks import WorkerSlot
from trainlib._internal.driver.run_plan import AttemptStart, rank_launch
from trainlib._internal.driver.run_record import RunRecord
from trainlib._internal.driver.watchdog import ProgressWatchdog
from trainlib._internal.rank.process_globals import RANK
from trainlib._internal.rank.session import Session
from trainlib.callbacks import GroupInfo
from trainlib.errors import ConfigError, RankFailure

if TYPE_CHECKING:
    from trainlib._internal.driver.run_plan import RunPlan
    from trainlib.result import Result


LOCAL = "local"  # the "worker" address of the one rank


class LocalController:
    """Runs a ``RunRecord`` here, once (no restart: a failure is raised)."""

    def __init__(self, plan: RunPlan) -> None:
        self.record = RunRecord(plan)

    def run(self) -> Result:
        """The whole run, to its Result."""
        error: BaseException | None = None
        try:
            _run_locally(self.record)
        except BaseException as exc:
            error = exc
        return self.record.conclude(error)


def _run_locally(run: RunRecord) -> None:
    """Run the plan's training function here, once; its failure is recorded on ``run`` and
    raised as a ``WorkerGroupError``."""
    plan = run.plan
    if RANK.session is not None:
        raise ConfigError(
            "ScalingConfig(num_workers=0) inside a training function: a rank already runs "
            "here; use num_workers=1 or more for a run started from a rank."
        )
    start_index, resume_from = run.resume_point()
    run.collector.validations.resume(run.manager.awaiting_validation())
    host = socket.gethostname()
    slot = WorkerSlot(LOCAL, host, world_rank=0, local_rank=0, local_world_size=1, node_rank=0)
    start = AttemptStart(
        plan, run.name, run.storage, start_index, resume_from, [slot], run.setup_payload
    )
    spec: RankSpec = cloudpickle.loads(rank_launch(start, slot, host, 0).spec_payload)
    user = UserCallbacks(run.callbacks, run.start_callbacks)
    run.start_callbacks(1)
    run.lifecycle.enter(Running(run.attempt, 1, str(resume_from or "scratch")))
    watchdog = ProgressWatchdog(None, [slot])
    run.collector.start_attempt(1, start_index, watchdog)
    feed: LocalFeed | None = None
    session = Session(spec, lambda message: _handle(run, feed, message))
    feed = LocalFeed(
        plan.datasets,
        plan.data_config.shuffle_seed,
        lambda name, pass_id, block: session.deliver(DataBlock(name, pass_id, block)),
    )
    run.collector.reply_with(lambda rank, command: _deliver(session, command))
    info = GroupInfo(1, (slot.placement(),), None)
    user.after_worker_group_start(info)
    RANK.start(session)
    try:
        if spec.setup_payload is not None:
            cloudpickle.loads(spec.setup_payload)()
        cloudpickle.loads(spec.train_func_payload)()
        session.uploads.wait()
    except _DriverError as driver_side:  # a callback stopped the run, as it would any run
        raise driver_side.error from None
    except Exception as exc:
        session.uploads.abandon()
        failure = RankFailure(
            0,
            host,
            "exception",
            f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
            time=time.time(),
        )
        raise run.failure_policy.record({0: failure}) from exc
    finally:
        RANK.reset()
        user.before_worker_group_shutdown(info)
    run.collector.check_all_complete()


class _DriverError(BaseException):
    """What the run's collector or a callback raised while handling a report, carried out
    through the training function (a BaseException, so its ``except Exception`` lets it by)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _handle(run: RunRecord, feed: LocalFeed | None, message: RankMessage) -> None:
    """A message of the training function, handled as the driver handles a rank's (the
    session sends one at a time); its logs are this process's own already."""
    if isinstance(message, DataRequest) and feed is not None:
        feed.request(message.dataset, message.pass_id)
        return
    if isinstance(message, DriverMessage):
        try:
            run.collector.handle(message)
        except Exception as exc:
            raise _DriverError(exc) from exc


def _deliver(session: Session, message: ToRank) -> None:
    session.deliver(message)

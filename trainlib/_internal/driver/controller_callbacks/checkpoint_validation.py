"""``report(validation=...)`` across a run: the validations run on the run's cluster, those a
stopped run left are resumed, a run that trained returns once every checkpoint is validated,
and those still running when it ends otherwise are cancelled (``validation_queue``)."""

from __future__ import annotations

from collections.abc import Callable

from distributed import Client

from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.controller_callbacks import ControllerCallback
from trainlib._internal.driver.validation_queue import Validations


class CheckpointValidation(ControllerCallback):
    def __init__(
        self, validations: Validations, manager: CheckpointManager, poll: Callable[[], None]
    ) -> None:
        self._validations = validations
        self._manager = manager
        self._poll = poll

    def after_controller_start(self, client: Client | None) -> None:
        self._validations.use(client)
        self._validations.resume(self._manager.awaiting_validation())

    def after_run_trained(self) -> None:
        self._validations.wait(self._poll)  # fit() returns with every checkpoint validated

    def before_controller_shutdown(self) -> None:
        self._validations.cancel()  # those not ended when the run stops otherwise

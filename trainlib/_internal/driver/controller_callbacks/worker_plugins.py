"""The run's worker plugins installed when the controller starts (``worker.plugins``)."""

from __future__ import annotations

from distributed import Client

from trainlib._internal.driver.controller_callbacks import ControllerCallback


class WorkerPlugins(ControllerCallback):
    def after_controller_start(self, client: Client | None) -> None:
        if client is None:  # local mode: no worker
            return
        from trainlib._internal.worker import plugins

        plugins.install(client)

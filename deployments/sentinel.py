"""The sentinel: what must be noticed even when the Prefect server is what failed.

    python -m deployments.sentinel --url https://hooks.example/x   # or $CIFAR_ALERTS_URL

One process (a container of the stack), a loop that every ``--interval-s``:

- checks the Prefect server's health: unhealthy for ``--down-s`` (300 s) is one message;
- while the server answers, checks that a run of ``--nightly`` (``train-cifar/nightly``)
  completed in the last ``--nightly-within-h`` (26 h): if not, one message (the dead-man's
  switch: a scheduler that stopped creating runs, a worker that never takes them);
- marks Crashed a Running flow run of the work pool (``--pool``) that sent no heartbeat for
  ``--zombie-s`` (90 s) *while the server was up*, and a run Pending for ``--pending-s``
  (600 s): its process is gone (a worker killed, a container evicted, a run that died before
  its first heartbeat); Prefect's ``cifar-run-failed`` automation then alerts and the run's
  concurrency slots are free for the next one;
- checks each ``--check NAME=URL`` (the services' health endpoints): failing for ``--down-s``
  is one message.

Why not a Prefect automation for zombies: a proactive trigger ("no heartbeat within 90 s")
counts the server's own downtime as the run's silence; after an outage longer than that it
marked a healthy training Crashed, which then failed (seen on the test rig). Here a run's
silence only counts while the server answers. Messages go straight to the webhook, never
through the Prefect server, so its own failure is reported. An incident gives one message;
the next one is sent after it ended. The webhook URL is a credential: it is never logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed

logger = logging.getLogger("deployments.sentinel")

URL_VARIABLE = "CIFAR_ALERTS_URL"


@dataclass(frozen=True, kw_only=True)
class SentinelConfig:
    """What the sentinel watches and its bounds (the command's options)."""

    webhook_url: str
    pool: str = "cifar"
    nightly: str = "train-cifar/nightly"
    nightly_within_s: float = 26 * 3600.0
    down_s: float = 300.0
    zombie_s: float = 90.0
    pending_s: float = 600.0
    interval_s: float = 15.0
    checks: Mapping[str, str] = field(default_factory=dict)  # service name -> health URL


class Incident:
    """A condition that must hold for ``bound_s`` before it is reported, once, until it ends."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self.since: float | None = None
        self.reported = False

    def observe(self, failing: bool, now: float) -> bool:
        """Record one observation; True exactly once per incident, when it is to be reported."""
        if not failing:
            self.since, self.reported = None, False
            return False
        if self.since is None:
            self.since = now
        if not self.reported and now - self.since >= self.bound_s:
            self.reported = True
            return True
        return False


def silent_since(last_heartbeat: float | None, started: float | None, up_since: float) -> float:
    """Since when a Running run has been silent while the server answered: its last heartbeat
    (else its start), but never before the server's current uptime began."""
    return max(t for t in (last_heartbeat, started, up_since) if t is not None)


def overdue(
    last_completed: float | None, watching_since: float, now: float, within_s: float
) -> bool:
    """Whether no nightly has completed within ``within_s`` (counted from when the sentinel
    started watching, for a stack that never completed one)."""
    return now - max(last_completed or watching_since, watching_since) > within_s


def post(webhook_url: str, subject: str, body: str) -> bool:
    """POST ``{"subject", "body"}`` to the webhook; whether it took it (never raises)."""
    data = json.dumps({"subject": subject, "body": body}).encode()
    request = urllib.request.Request(
        webhook_url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10):
            return True
    except OSError as error:
        logger.warning("The alert webhook did not take %r: %s", subject, type(error).__name__)
        return False


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(200 <= response.status < 300)
    except OSError:
        return False


def _timestamp(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


class Sentinel:
    """The loop's state between rounds; ``round()`` is one round."""

    def __init__(
        self,
        config: SentinelConfig,
        clock: Callable[[], float] = time.time,
        send: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._send = send or (lambda subject, body: post(config.webhook_url, subject, body))
        self._unsent: list[tuple[str, str]] = []
        self.watching_since = clock()
        self.up_since: float | None = None
        self.server = Incident(config.down_s)
        self.services = {name: Incident(config.down_s) for name in config.checks}
        self._overdue_reported_for: float | None = None

    def alert(self, subject: str, body: str) -> None:
        logger.warning("Alert: %s", subject)
        self._unsent.append((subject, body))

    def _flush(self) -> None:
        self._unsent = [(s, b) for s, b in self._unsent if not self._send(s, b)]

    def round(self) -> None:
        """Check everything once, then send what is to be sent."""
        now = self._clock()
        for name, url in self.config.checks.items():
            if self.services[name].observe(not _healthy(url), now):
                self.alert(
                    f"service {name}: unhealthy for {self.config.down_s:.0f} s",
                    f"{name}'s health check ({url}) has failed since "
                    f"{_iso(self.services[name].since)}: look at its container and its log "
                    "(docker compose ps; docker compose logs).",
                )
        try:
            self._round_with_server(now)
        finally:
            self._flush()

    def _round_with_server(self, now: float) -> None:
        with get_client(sync_client=True) as client:
            error = client.api_healthcheck()
            if self.server.observe(error is not None, now):
                self.alert(
                    f"Prefect server unhealthy for {self.config.down_s:.0f} s",
                    f"The Prefect API has not answered its health check since "
                    f"{_iso(self.server.since)} ({type(error).__name__}): no flow run starts, "
                    "no alert of the server is sent. Look at the prefect-server container, its "
                    "database and its disk.",
                )
            if error is not None:
                self.up_since = None
                return
            if self.up_since is None:
                self.up_since = now
            self._check_nightly(client, now)
            self._reap(client, now, self.up_since)

    def _check_nightly(self, client: Any, now: float) -> None:
        try:
            deployment = client.read_deployment_by_name(self.config.nightly)
        except ObjectNotFound:  # not deployed (yet): nothing has completed
            deployment = None
        runs = (
            []
            if deployment is None
            else client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.COMPLETED])
                    )
                ),
                sort=FlowRunSort.END_TIME_DESC,
                limit=1,
            )
        )
        last = _timestamp(runs[0].end_time) if runs else None
        reference = max(last or self.watching_since, self.watching_since)
        if not overdue(last, self.watching_since, now, self.config.nightly_within_s):
            return
        if self._overdue_reported_for == reference:
            return
        self._overdue_reported_for = reference
        hours = self.config.nightly_within_s / 3600
        self.alert(
            f"{self.config.nightly}: no run completed in {hours:g} h",
            f"The last completed run of {self.config.nightly} ended at "
            f"{_iso(last) if last else 'never (since the sentinel started)'}. Is the schedule "
            "active, a worker of the pool running, the last runs failing? (Prefect UI: the "
            "deployment's runs.)",
        )

    def _reap(self, client: Any, now: float, up_since: float) -> None:
        """Mark Crashed the pool's runs that are silent while the server is up, or Pending for
        too long."""
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
                )
            ),
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[self.config.pool])),
        )
        for run in runs:
            message = self._verdict(client, run, now, up_since)
            if message is not None:
                logger.warning("Flow run %s (%s) marked Crashed: %s", run.name, run.id, message)
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)

    def _verdict(self, client: Any, run: Any, now: float, up_since: float) -> str | None:
        entered = _timestamp(run.state.timestamp) if run.state else None
        if run.state.type.value == "PENDING":
            if entered is not None and now - max(entered, up_since) > self.config.pending_s:
                return (
                    f"Pending for {self.config.pending_s:.0f} s: its process never started "
                    "(marked Crashed by the sentinel)."
                )
            return None
        silent = silent_since(_last_heartbeat(client, run.id), entered, up_since)
        if now - silent <= self.config.zombie_s:
            return None
        return (
            f"No heartbeat for {self.config.zombie_s:.0f} s while the server was up: the process "
            "running this flow run is gone (its worker or container died?). Marked Crashed by the "
            "sentinel; a retry resumes from the last checkpoint (same run_name)."
        )


def _last_heartbeat(client: Any, flow_run_id: Any) -> float | None:
    """When the run's last heartbeat occurred, as the server recorded it (None: never)."""

    page = client.read_events(
        EventFilter(
            event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
        ),
        limit=1,
    )
    return _timestamp(page.events[0].occurred) if page.events else None


def _iso(moment: float | None) -> str:
    if moment is None:
        return "unknown"
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


def _check(value: str) -> tuple[str, str]:
    name, _, url = value.partition("=")
    if not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"--check takes NAME=http://host:port/path, not {value}")
    return name, url


def parse(argv: list[str] | None = None) -> SentinelConfig:
    """The config from the command line (each option's default from the environment)."""
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=env(URL_VARIABLE), help=f"the webhook (${URL_VARIABLE})")
    parser.add_argument("--pool", default=env("CIFAR_SENTINEL_POOL", "cifar"))
    parser.add_argument("--nightly", default=env("CIFAR_SENTINEL_NIGHTLY", "train-cifar/nightly"))
    hours = float(env("CIFAR_SENTINEL_NIGHTLY_WITHIN_H", "26"))
    parser.add_argument("--nightly-within-h", type=float, default=hours)
    parser.add_argument("--down-s", type=float, default=float(env("CIFAR_SENTINEL_DOWN_S", "300")))
    parser.add_argument(
        "--zombie-s", type=float, default=float(env("CIFAR_SENTINEL_ZOMBIE_S", "90"))
    )
    pending = float(env("CIFAR_SENTINEL_PENDING_S", "600"))
    parser.add_argument("--pending-s", type=float, default=pending)
    interval = float(env("CIFAR_SENTINEL_INTERVAL_S", "15"))
    parser.add_argument("--interval-s", type=float, default=interval)
    checks = [_check(c) for c in env("CIFAR_SENTINEL_CHECKS", "").split() if c]
    parser.add_argument("--check", type=_check, action="append", default=checks)
    args = parser.parse_args(argv)
    if not args.url:
        parser.error(f"give the webhook: --url or ${URL_VARIABLE} (a secret file in the stack)")
    return SentinelConfig(
        webhook_url=args.url,
        pool=args.pool,
        nightly=args.nightly,
        nightly_within_s=args.nightly_within_h * 3600,
        down_s=args.down_s,
        zombie_s=args.zombie_s,
        pending_s=args.pending_s,
        interval_s=args.interval_s,
        checks=dict(args.check),
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request, every round
    config = parse(argv)
    sentinel = Sentinel(config)
    logger.info(
        "Watching pool %s and %s (webhook set; checks: %s)",
        config.pool,
        config.nightly,
        ", ".join(config.checks) or "none",
    )
    while True:
        try:
            sentinel.round()
        except Exception as error:  # a round that failed (the server mid-restart): next round
            logger.warning("Round failed: %s: %s", type(error).__name__, str(error)[:300])
        time.sleep(config.interval_s)


if __name__ == "__main__":
    main()

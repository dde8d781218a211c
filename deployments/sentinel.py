"""The sentinel: what must be noticed even when the Prefect server is what failed.

    python -m deployments.sentinel --url https://hooks.example/x   # or $CIFAR_ALERTS_URL
    python -m deployments.sentinel --healthcheck                   # the container's healthcheck

One process (a container of the stack), a loop that every ``--interval-s`` (15 s):

- checks that the Prefect server is **ready** (``/api/ready``: it answers and reaches its
  database): not ready for ``--down-s`` (300 s) is one message, whatever the cause;
- checks that the server **stores events**: it posts one every round and reads it back; none
  stored for ``--down-s`` is one message (heartbeats and automation triggers are being lost);
- for each **scheduled deployment** of the work pool (``--pool``), works out the last fire
  time whose run has had the time the last completed run took plus ``--grace-h`` (2 h): no run
  completed since is one message (a scheduler that stopped creating runs, a worker that never
  takes them, nights that all fail);
- marks Crashed a Running flow run of the pool silent for ``--zombie-s`` (90 s), and one
  Pending for ``--pending-s`` (600 s), both counted on the server's clock over the time it was
  storing events (``deployments/watch_rules.py``): a database outage, events dropped or a
  clock step of the sentinel's host never count as silence; Prefect's ``cifar-run-failed``
  automation then alerts and the run's concurrency slots are free for the next one;
- checks each ``--check NAME=URL`` (the services' health endpoints): failing for ``--down-s``
  is one message; each ``--disk NAME=PATH`` over ``--disk-full-pct`` (90) is one message; each
  ``--cert PATH`` expiring within ``--cert-days`` (30) is one message;
- pings ``--heartbeat-url`` (a dead-man's switch another system watches: the sentinel's own
  silence is seen there) once a minute, and saves its state (``--state``) so that a restart
  repeats no alert and restarts no incident's clock.

It starts whether or not Prefect answers (a server that never comes is reported). Messages go
straight to the webhook, never through the Prefect server. The webhook and heartbeat URLs are
credentials: they are never logged.
"""

from __future__ import annotations

import logging
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.states import Crashed

from deployments import host_checks, prefect_watch, sentinel_state
from deployments.schedule_fires import last_fire
from deployments.sentinel_config import SentinelConfig, config, parser
from deployments.watch_rules import Incident, due, kept, overdue, silence
from deployments.webhook import post

logger = logging.getLogger("deployments.sentinel")

HEARTBEAT_EVERY_S = 60.0  # pings of the dead-man's switch


@dataclass
class _Posted:
    id: uuid.UUID
    at: float  # time.monotonic() when posted
    fresh: bool


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
        self.state = sentinel_state.load(config.state_path)
        self._posted: list[_Posted] = []
        self._fresh = True  # the next event starts a count: no ready round before it
        self._last_ping: float | None = None
        self.incidents: dict[str, Incident] = {}

    def incident(self, key: str, bound_s: float) -> Incident:
        """The incident ``key`` (restored from the saved state on first use)."""
        if key not in self.incidents:
            self.incidents[key] = Incident(bound_s)
            self.incidents[key].restore(self.state.incidents.get(key, {}))
        return self.incidents[key]

    def alert(self, subject: str, body: str) -> None:
        logger.warning("Alert: %s", subject)
        self.state.unsent.append([subject, body])

    def round(self) -> None:
        """Check everything once, then send what is to be sent and save the state."""
        now = self._clock()
        try:
            self._check_host(now)
            self._check_prefect(now)
        except Exception as error:  # the server mid-restart: the next round
            self._fresh = True
            logger.warning("Round failed: %s: %s", type(error).__name__, str(error)[:300])
        finally:
            self.state.unsent = [[s, b] for s, b in self.state.unsent if not self._send(s, b)]
            self._ping()
            self.state.incidents = {k: i.saved() for k, i in self.incidents.items()}
            self.state.last_round = self._clock()
            try:
                sentinel_state.save(self.config.state_path, self.state)
            except OSError as error:  # a full disk: alerted (--disk); the healthcheck fails
                logger.warning("The state could not be saved: %s", error)

    def _ping(self) -> None:
        url, moment = self.config.heartbeat_url, time.monotonic()
        if url is None or (self._last_ping and moment - self._last_ping < HEARTBEAT_EVERY_S):
            return
        try:
            with urllib.request.urlopen(url, timeout=10):
                self._last_ping = moment
        except OSError as error:
            logger.warning("The heartbeat URL did not answer: %s", type(error).__name__)

    def _check_host(self, now: float) -> None:
        bound = self.config.down_s
        for name, url in self.config.checks.items():
            incident = self.incident(f"service:{name}", bound)
            if incident.observe(not host_checks.answers(url), now):
                self.alert(
                    f"service {name}: unhealthy for {bound:.0f} s",
                    f"{name}'s health check ({url}) has failed since {_iso(incident.since)}: "
                    "look at its container and its log (docker compose ps; docker compose logs).",
                )
        for name, path in self.config.disks.items():
            limit = self.config.disk_full_pct
            try:
                percent = host_checks.used_percent(path)
                used, full = f"{percent:.0f}% full", percent >= limit
            except OSError as error:
                used, full = f"unreadable ({error})", True
            if self.incident(f"disk:{name}", 0).observe(full, now):
                self.alert(
                    f"disk {name}: over {limit:g}% used",
                    f"The disk holding {name} ({path}) is {used}. A full disk stops the "
                    "database, checkpoints and artifacts: let retention run "
                    "(deployments/mlflow_retention.py), free or grow the volume.",
                )
        for path in self.config.certs:
            try:
                ends, why = host_checks.expires(path), ""
            except (OSError, ValueError) as error:
                ends, why = 0.0, f" ({error})"
            days = self.config.cert_days
            if self.incident(f"cert:{path}", 0).observe(ends - now < days * 86400, now):
                self.alert(
                    f"certificate {path}: expires within {days:g} days",
                    f"{path} expires at {_iso(ends) if ends else 'unknown'}{why}. Make new "
                    "certificates and restart the services (docs/containers.md, rotation).",
                )

    def _check_prefect(self, now: float) -> None:
        bound = self.config.down_s
        why = prefect_watch.readiness()
        server = self.incident("prefect", bound)
        if server.observe(why is not None, now):
            self.alert(
                f"Prefect server not ready for {bound:.0f} s",
                f"The Prefect server has not been ready since {_iso(server.since)}: {why}. No "
                "flow run starts, no automation fires, no run is marked Crashed meanwhile. Look "
                "at the prefect-server container, its database (postgres) and their disks.",
            )
        if why is not None:
            self._posted, self._fresh = [], True
            return
        with get_client(sync_client=True) as client:
            self._read_back(client, now)
            self._post_round()
            for deployment in prefect_watch.scheduled(client, self.config.pool):
                self._check_overdue(client, deployment, now)
            self._reap(client)

    def _post_round(self) -> None:
        posted = _Posted(uuid.uuid4(), time.monotonic(), self._fresh)
        prefect_watch.post_round(posted.id)
        self._posted.append(posted)
        self._fresh = False

    def _read_back(self, client: Any, now: float) -> None:
        """Move the events posted earlier that the server stored into the state, in order;
        an event not stored within ``gap_s`` is an incident of the event store."""
        if self._posted:
            received = prefect_watch.stored_at(client, [p.id for p in self._posted], now)
            # the server stores them in order: one not stored before a stored one was lost,
            # and heartbeats may have been lost with it (the stored one starts a count)
            last = max((i for i, p in enumerate(self._posted) if p.id in received), default=-1)
            lost = False
            for posted in self._posted[: last + 1]:
                if posted.id in received:
                    self.state.stored.append([received[posted.id], posted.fresh or lost])
                lost = posted.id not in received
            moment = time.monotonic()
            self._posted = [p for p in self._posted[last + 1 :] if moment - p.at < 600]
        span = max(self.config.zombie_s, self.config.pending_s) + self.config.gap_s
        self.state.stored = kept(self.state.stored, span)
        late = [p for p in self._posted if time.monotonic() - p.at > self.config.gap_s]
        bound = self.config.down_s
        if self.incident("events", bound).observe(bool(late), now):
            self.alert(
                f"Prefect stores no events for {bound:.0f} s",
                "The Prefect server answers and reaches its database, but the events posted "
                "to it are not stored: flow runs' heartbeats and automations' triggers are "
                "lost, no run is marked Crashed meanwhile. Look at the prefect-server log "
                "(its event persister) and its database's disk.",
            )

    def _check_overdue(self, client: Any, deployment: Any, now: float) -> None:
        name = prefect_watch.full_name(client, deployment)
        ended, took = prefect_watch.last_completed(client, deployment)
        allowance = took + self.config.grace_s
        fires = [last_fire(s.schedule, now - allowance) for s in deployment.schedules if s.active]
        due_at = due(fires, since=deployment.created.timestamp())
        if self.incident(f"overdue:{name}", 0).observe(overdue(due_at, ended), now):
            self.alert(
                f"{name}: no run completed since the one due at {_iso(due_at)}",
                f"The schedule of {name} planned a run at {_iso(due_at)}; it has had "
                f"{allowance / 3600:.1f} h (the last run's duration and --grace-h) and none "
                f"completed since (the last ended {_iso(ended) if ended else 'never'}). Is the "
                "schedule active, a worker of the pool running, the last runs failing? (Prefect "
                "UI: the deployment's runs.)",
            )

    def _reap(self, client: Any) -> None:
        """Mark Crashed the pool's runs silent (or Pending) for too long on the server's clock."""
        for run in prefect_watch.live_runs(client, self.config.pool):
            message = self._verdict(client, run)
            if message is not None:
                logger.warning("Flow run %s (%s) marked Crashed: %s", run.name, run.id, message)
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)

    def _verdict(self, client: Any, run: Any) -> str | None:
        entered = run.state.timestamp.timestamp()
        stored, gap = self.state.stored, self.config.gap_s
        if run.state.type == StateType.PENDING:
            if silence(entered, stored, gap) > self.config.pending_s:
                return (
                    f"Pending for {self.config.pending_s:.0f} s: its process never started "
                    "(marked Crashed by the sentinel)."
                )
            return None
        heard = prefect_watch.last_heartbeat(client, run.id, self._clock())
        if silence(max(heard or entered, entered), stored, gap) <= self.config.zombie_s:
            return None
        return (
            f"No heartbeat for {self.config.zombie_s:.0f} s while the server was storing events: "
            "the process running this flow run is gone (its worker or container died?). Marked "
            "Crashed by the sentinel; a retry resumes from the last checkpoint (same run_name)."
        )


def _iso(moment: float | None) -> str:
    if moment is None:
        return "unknown"
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


def parse(argv: list[str] | None = None) -> SentinelConfig:
    """The config from the command line (each option's default from the environment)."""
    parsing = parser(__doc__.split("\n\n")[0])
    args = parsing.parse_args(argv)
    if not args.url:
        parsing.error("give the webhook: --url or $CIFAR_ALERTS_URL (a secret file in the stack)")
    return config(args)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request, every round
    args = parser(__doc__.split("\n\n")[0]).parse_args(argv)
    if args.healthcheck:
        bound = max(3 * args.interval_s, 60.0)
        if (why := sentinel_state.unhealthy(args.state, time.time(), bound)) is not None:
            sys.exit(f"sentinel unhealthy: {why}")
        return
    settings = parse(argv)
    sentinel = Sentinel(settings)
    logger.info(
        "Watching pool %s (webhook set; heartbeat %s; checks: %s; state %s)",
        settings.pool,
        "set" if settings.heartbeat_url else "none",
        ", ".join(settings.checks) or "none",
        settings.state_path,
    )
    while True:
        sentinel.round()
        time.sleep(settings.interval_s)


if __name__ == "__main__":
    main()

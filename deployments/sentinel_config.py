"""The sentinel's options: the command line, each option's default from the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deployments import sentinel_state

URL_VARIABLE, HEARTBEAT_VARIABLE = "CIFAR_ALERTS_URL", "CIFAR_SENTINEL_HEARTBEAT_URL"


@dataclass(frozen=True, kw_only=True)
class SentinelConfig:
    """What the sentinel watches and its bounds (the command's options)."""

    webhook_url: str
    pool: str = "cifar"
    grace_s: float = 2 * 3600.0
    down_s: float = 300.0
    zombie_s: float = 90.0
    pending_s: float = 600.0
    interval_s: float = 15.0
    checks: Mapping[str, str] = field(default_factory=dict)  # service name -> health URL
    disks: Mapping[str, str] = field(default_factory=dict)  # name -> a path on that disk
    disk_full_pct: float = 90.0
    certs: Sequence[str] = ()
    cert_days: float = 30.0
    heartbeat_url: str | None = None
    state_path: Path = field(default_factory=sentinel_state.default_path)

    @property
    def gap_s(self) -> float:
        """A longer gap between the sentinel's stored events breaks the count of silence:
        three rounds, or a third of ``zombie_s`` where that is longer (slow rounds on a busy
        host). Events lost in a shorter gap are at most one heartbeat of a live run, whose
        heartbeats (30 s) are under two thirds of ``zombie_s``."""
        return max(3 * self.interval_s, self.zombie_s / 3)


def _named(option: str, url: bool) -> Callable[[str], tuple[str, str]]:
    def convert(value: str) -> tuple[str, str]:
        name, _, target = value.partition("=")
        if not name or not target or (url and not target.startswith(("http://", "https://"))):
            example = "http://host:port/path" if url else "/a/path"
            raise argparse.ArgumentTypeError(f"{option} takes NAME={example}, not {value}")
        return name, target

    return convert


def parser(description: str) -> argparse.ArgumentParser:
    """The command's options; lists (``--check``, ``--disk``, ``--cert``) also from
    whitespace-separated variables."""
    env = os.environ.get
    parsing = argparse.ArgumentParser(description=description)
    parsing.add_argument("--url", default=env(URL_VARIABLE), help=f"the webhook (${URL_VARIABLE})")
    parsing.add_argument("--healthcheck", action="store_true", help="exit 0 while rounds run")
    parsing.add_argument("--pool", default=env("CIFAR_SENTINEL_POOL", "cifar"))
    numbers = {
        "--grace-h": ("CIFAR_SENTINEL_GRACE_H", "2"),
        "--down-s": ("CIFAR_SENTINEL_DOWN_S", "300"),
        "--zombie-s": ("CIFAR_SENTINEL_ZOMBIE_S", "90"),
        "--pending-s": ("CIFAR_SENTINEL_PENDING_S", "600"),
        "--interval-s": ("CIFAR_SENTINEL_INTERVAL_S", "15"),
        "--disk-full-pct": ("CIFAR_SENTINEL_DISK_FULL_PCT", "90"),
        "--cert-days": ("CIFAR_SENTINEL_CERT_DAYS", "30"),
    }
    for option, (variable, default) in numbers.items():
        parsing.add_argument(option, type=float, default=float(env(variable, default)))
    lists: dict[str, tuple[str, Callable[[str], object]]] = {
        "--check": ("CIFAR_SENTINEL_CHECKS", _named("--check", url=True)),
        "--disk": ("CIFAR_SENTINEL_DISKS", _named("--disk", url=False)),
        "--cert": ("CIFAR_SENTINEL_CERTS", str),
    }
    for option, (variable, convert) in lists.items():
        given = [convert(v) for v in env(variable, "").split() if v]
        parsing.add_argument(option, type=convert, action="append", default=given)
    parsing.add_argument("--heartbeat-url", default=env(HEARTBEAT_VARIABLE))
    parsing.add_argument("--state", type=Path, default=sentinel_state.default_path())
    return parsing


def config(args: argparse.Namespace) -> SentinelConfig:
    """The config of parsed ``args`` (which must hold the webhook)."""
    return SentinelConfig(
        webhook_url=args.url,
        pool=args.pool,
        grace_s=args.grace_h * 3600,
        down_s=args.down_s,
        zombie_s=args.zombie_s,
        pending_s=args.pending_s,
        interval_s=args.interval_s,
        checks=dict(args.check),
        disks=dict(args.disk),
        disk_full_pct=args.disk_full_pct,
        certs=tuple(args.cert),
        cert_days=args.cert_days,
        heartbeat_url=args.heartbeat_url or None,  # an empty secret file: none
        state_path=args.state,
    )

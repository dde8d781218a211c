"""Simulated hosts for tests: network namespaces on a bridge, one per host, so a multi-host
Dask cluster and its ranks run on one machine with real TCP between distinct addresses.

Needs root and iproute2. Each host ``{prefix}-hN`` has ``eth0`` with ``{net}.N`` on a bridge
in the namespace ``{prefix}-sw``; ``cut(N)`` pulls host N's cable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


def unavailable_reason() -> str | None:
    """Why simulated hosts cannot be made on this machine, or None when they can."""
    if shutil.which("ip") is None:
        return (
            "simulated hosts need iproute2 (as root on Debian/Ubuntu: apt-get install -y iproute2)"
        )
    if os.geteuid() != 0:
        return "simulated hosts are network namespaces: making them needs root"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Hosts:
    """Namespaces ``{prefix}-h1`` .. ``-hN`` with addresses ``{net}.1`` .. ``{net}.N``."""

    prefix: str
    net: str
    count: int

    def name(self, host: int) -> str:
        return f"{self.prefix}-h{host}"

    def address(self, host: int) -> str:
        return f"{self.net}.{host}"

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``host``."""
        return ["ip", "netns", "exec", self.name(host), *argv]

    def cut(self, host: int) -> None:
        _ip("-n", f"{self.prefix}-sw", "link", "set", f"p{host}", "down")


@contextmanager
def simulated_hosts(prefix: str, net: str, count: int) -> Iterator[Hosts]:
    """Create the hosts; on exit kill what runs in them and delete them."""
    hosts = Hosts(prefix, net, count)
    switch = f"{prefix}-sw"
    try:
        _ip("route", "replace", "unreachable", f"{net}.0/24")  # never leaves via the default
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host in range(1, count + 1):
            name = hosts.name(host)
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip(
                "-n",
                name,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                f"p{host}",
                "netns",
                switch,
            )
            _ip("-n", name, "addr", "add", f"{hosts.address(host)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", switch, "link", "set", f"p{host}", "master", "br0")
            _ip("-n", switch, "link", "set", f"p{host}", "up")
        yield hosts
    finally:
        for name in [hosts.name(h) for h in range(1, count + 1)] + [switch]:
            pids = subprocess.run(
                ["ip", "netns", "pids", name], capture_output=True, text=True
            ).stdout.split()
            if pids:
                subprocess.run(["kill", "-9", *pids], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "route", "del", "unreachable", f"{net}.0/24"], capture_output=True)

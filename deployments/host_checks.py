"""What the sentinel checks outside Prefect: a service's health endpoint, how full a disk is,
when a certificate expires."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

from cryptography import x509


def answers(url: str) -> bool:
    """Whether the health endpoint ``url`` answers 2xx within 5 s."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(200 <= response.status < 300)
    except OSError:
        return False


def used_percent(path: str) -> float:
    """How full the file system holding ``path`` is, in percent of what its users may fill
    (``df``'s Use%: the blocks reserved for root count as full)."""
    usage = shutil.disk_usage(path)
    return 100.0 * usage.used / max(usage.used + usage.free, 1)


def expires(path: str) -> float:
    """When the first certificate of the PEM file ``path`` to expire does (seconds since the
    epoch). Raises ValueError naming the file when it holds no certificate."""
    try:
        certificates = x509.load_pem_x509_certificates(Path(path).read_bytes())
    except ValueError as error:
        raise ValueError(f"{path} holds no PEM certificate ({error})") from None
    return min(c.not_valid_after_utc.timestamp() for c in certificates)

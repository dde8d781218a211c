"""URLs and paths as the run policy compares them: a place made comparable, a prefix that
covers it, the link-local address a host reaches, and a value shown without its password."""

from __future__ import annotations

import ipaddress
import os
import socket
from urllib.parse import urlsplit

from cifar.errors import InvalidParameterError


class PolicyError(InvalidParameterError):
    """A parameter names a place or server the worker's run policy does not allow."""


# schemes whose "host" is a bucket or container on a configured endpoint, not a network address
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
_METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "instance-data"})
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254", "169.254.169.254")
)


def place(name: str, value: str) -> str:
    """``value`` as a comparable URL: scheme and host in lower case, a local path absolute with
    its links resolved.

    Raises:
        PolicyError: A chained fsspec URL (``::``) or a ``..`` segment, which a prefix cannot
            confine.
    """
    if "::" in value:
        raise PolicyError(
            f"{name} {shown(value)!r} chains fsspec filesystems (::), which the run policy "
            "cannot confine; name the place itself."
        )
    scheme, sep, rest = value.partition("://")
    if not sep or len(scheme) < 2:  # a path (or a Windows drive)
        return "file://" + os.path.realpath(value)
    scheme = scheme.lower()
    if scheme in ("file", "local"):
        return "file://" + os.path.realpath(rest or "/")
    host, slash, path = rest.partition("/")
    if ".." in path.split("/"):
        raise PolicyError(
            f"{name} {shown(value)!r} has a '..' segment, which the run policy cannot confine; "
            "name the place itself."
        )
    return f"{scheme}://{host.lower()}{slash}{path}"


def covers(entry: str, place: str) -> bool:
    if entry.endswith("://"):
        return place.startswith(entry)
    entry = entry.rstrip("/")
    return place == entry or place.startswith(entry + "/")


def same_server(own: str, value: str) -> bool:
    return own.rstrip("/") == value.rstrip("/")


def link_local_address(value: str) -> str | None:
    """The link-local or metadata address ``value`` reaches, if any (its host resolved)."""
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        return None
    if not host or parts.scheme.lower() in _BUCKET_SCHEMES | {"file", "local", ""}:
        return None
    if host.rstrip(".").lower() in _METADATA_HOSTS:
        return host
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return None  # unresolvable: the download says so
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        if address.is_link_local or address in _METADATA_ADDRESSES:
            return str(address)
    return None


def shown(value: str | None) -> str:
    """``value`` with any password in it replaced by ``***``: fit for a message or a log."""
    if not value:
        return ""
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        return value
    return value.replace(f":{password}@", ":***@") if password else value

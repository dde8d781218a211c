"""Where an http(s) URL a run names really leads: each redirect checked against the run policy.

The policy checks the URL a run names; a server may answer it with a redirect to a place the
policy refuses (a cloud metadata address, the scheduler's dashboard, a private service), and
whatever that place answers would be stored as the run's data. So the flow follows the
redirects itself, checking every hop as if the run had named it, and the download then reads
the last URL without following any redirect (``tasks.download``): a redirect that appears only
at download time fails it.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import requests

from flows.places import PolicyError, shown
from flows.run_policy import RunPolicy

MAX_REDIRECTS = 5
_TIMEOUT_S = (30.0, 60.0)  # connect, read


def final_url(name: str, url: str, policy: RunPolicy) -> str:
    """The URL ``url`` (parameter ``name``) leads to, every redirect allowed by ``policy``.

    Not http(s), or a server that cannot be reached: ``url`` itself (the download reports the
    network, with its retries).

    Raises:
        PolicyError: A redirect to a place the policy refuses, or more than ``MAX_REDIRECTS``.
    """
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        return url
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        try:
            location = _redirect(current)
        except requests.RequestException:
            return current
        if location is None:
            return current
        following = urljoin(current, location)
        try:
            policy.confine(**{name: following})
        except PolicyError as error:
            raise PolicyError(
                f"{name} {shown(url)!r} redirects to {shown(following)!r}, which the run policy "
                f"refuses: {error}"
            ) from None
        current = following
    raise PolicyError(
        f"{name} {shown(url)!r} redirects more than {MAX_REDIRECTS} times; name the URL it "
        "finally serves instead."
    )


def _redirect(url: str) -> str | None:
    """Where ``url`` redirects, asked with HEAD (no body sent and cut off: a server would log a
    broken pipe), or with a GET closed at once where the server refuses HEAD."""
    with requests.head(url, allow_redirects=False, timeout=_TIMEOUT_S) as reply:
        if reply.status_code not in (405, 501):
            return reply.headers.get("Location") if reply.is_redirect else None
    with requests.get(url, allow_redirects=False, stream=True, timeout=_TIMEOUT_S) as reply:
        return reply.headers.get("Location") if reply.is_redirect else None

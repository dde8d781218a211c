"""The sentinel's alerts, POSTed to the operator's webhook as ``{"subject", "body"}`` (the shape
Prefect's automations post too); a webhook that does not take one is logged, never raised."""

from __future__ import annotations

import json
import logging
import urllib.request

logger = logging.getLogger("deployments.sentinel")


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

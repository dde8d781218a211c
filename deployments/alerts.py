"""Apply deployments/automations.yaml to the Prefect server at $PREFECT_API_URL.

    python -m deployments.alerts --block custom-webhook/cifar-alerts --url https://hooks.example/x

Run after the deployments exist (the compose stack's deploy step runs it): each automation's
``deployments`` are matched by id, so a deployment of the same name in another flow is not
covered. ``--block`` names the Prefect notification block the alerts go through
(``block-type/name``, default ``$CIFAR_ALERTS_BLOCK``); with ``--url`` (default
``$CIFAR_ALERTS_URL``) a ``custom-webhook`` block of that name is created or updated to POST
``{"subject": ..., "body": ...}`` there. ``--notify-for`` (``$CIFAR_ALERTS_DEPLOYMENTS``)
names the deployments whose runs notify (``*`` or empty: every one the file lists); an
automation that covers none of them is not applied, saying so. Earlier automations of the same
names are replaced: running it again is safe. (Zombie runs are the sentinel's:
``deployments/sentinel.py``.)

It exits non-zero, with one line naming the cause and changing nothing on the server, when an
alert it was asked for cannot be applied: no block of that name and no ``--url`` to make it, a
``--notify-for`` name the file does not list (a typo), or a value that is still a compose
expression (``${...}``, which some compose engines leave unexpanded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore
from prefect.exceptions import ObjectNotFound

AUTOMATIONS = Path(__file__).with_name("automations.yaml")
BLOCK_VARIABLE, URL_VARIABLE = "CIFAR_ALERTS_BLOCK", "CIFAR_ALERTS_URL"
DEPLOYMENTS_VARIABLE = "CIFAR_ALERTS_DEPLOYMENTS"  # comma-separated; * or empty: all listed
DEFAULT_BLOCK = "custom-webhook/cifar-alerts"
EVERY_DEPLOYMENT = "*"
_UNEXPANDED = re.compile(r"\$\{[^}]*\}")


class AlertsError(Exception):
    """An alert that was asked for cannot be applied; the message names the cause and the fix."""


def webhook_block(reference: str, url: str) -> None:
    """Create or update the ``custom-webhook`` block ``reference`` to POST to ``url``."""
    block_type, _, name = reference.partition("/")
    if block_type != "custom-webhook" or not name:
        raise SystemExit(
            f"--url makes a custom-webhook block: use --block custom-webhook/NAME, not {reference}"
        )
    CustomWebhookNotificationBlock(
        name=name, url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"}
    ).save(name, overwrite=True)


async def block_id(reference: str) -> str | None:
    """The id of the notification block ``reference``, or None where there is none."""
    block_type, _, name = reference.partition("/")
    async with get_client() as client:
        try:
            document = await client.read_block_document_by_name(
                name, block_type, include_secrets=False
            )
        except ObjectNotFound:
            return None
    return str(document.id)


async def _ids(client: Any, spec: dict[str, Any]) -> dict[str, str]:
    """The ids of the deployments and the work pool ``spec`` names."""
    found = {}
    for name in spec.get("deployments", []):
        deployment = await client.read_deployment_by_name(name)
        found[name] = f"prefect.deployment.{deployment.id}"
    if pool := spec.get("work_pool"):
        found[pool] = f"prefect.work-pool.{(await client.read_work_pool(pool)).id}"
    return found


def automation(
    spec: dict[str, Any],
    ids: dict[str, str],
    block: str,
    within: dict[str, int],
    notify_for: frozenset[str] | None = None,
) -> AutomationCore | None:
    """The automation ``spec`` describes, matched by ``ids``, notifying through the block of id
    ``block`` for the deployments of ``notify_for`` (None: all it lists; None is returned where
    it covers none of them); ``within`` overrides its time bound."""
    spec = dict(spec)
    deployments, pool = spec.pop("deployments", []), spec.pop("work_pool", None)
    notify, subject, body = spec.pop("notify", False), spec.pop("subject", ""), spec.pop("body", "")
    if notify and deployments and notify_for is not None:
        deployments = [name for name in deployments if name in notify_for]
        if not deployments:
            return None
    trigger = dict(spec["trigger"])
    if deployments:
        trigger["match_related"] = {
            "prefect.resource.role": "deployment",
            "prefect.resource.id": [ids[name] for name in deployments],
        }
    if pool:
        trigger["match"] = {"prefect.resource.id": ids[pool]}
    trigger["within"] = within.get(spec["name"], trigger["within"])
    actions = list(spec.get("actions", []))
    if notify:
        actions.append(
            {
                "type": "send-notification",
                "block_document_id": block,
                "subject": subject,
                "body": body,
            }
        )
    return AutomationCore.model_validate({**spec, "trigger": trigger, "actions": actions})


def specs(path: Path) -> list[dict[str, Any]]:
    """The automations ``path`` describes."""
    found: list[dict[str, Any]] = yaml.safe_load(path.read_text())["automations"]
    return found


def expanded(option: str, variable: str, value: str) -> str:
    """``value`` itself, refused where it is still a compose expression (``${...}``).

    Raises:
        AlertsError: Naming the option and its variable.
    """
    if _UNEXPANDED.search(value):
        raise AlertsError(
            f"{option} / ${variable} is {value!r}, a compose expression the compose engine did "
            "not expand; nothing was changed. Set the variable (docker/.env), or write the value "
            "itself into the compose file."
        )
    return value


def notify_for(value: str, listed: list[dict[str, Any]]) -> frozenset[str] | None:
    """The deployments ``--notify-for`` names (None: every one), each one the file lists.

    Raises:
        AlertsError: A name no automation lists.
    """
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    if not names or names == {EVERY_DEPLOYMENT}:
        return None
    known = {name for spec in listed for name in spec.get("deployments", [])}
    if unknown := sorted(names - known):
        raise AlertsError(
            f"--notify-for / ${DEPLOYMENTS_VARIABLE} names {', '.join(unknown)}, which no "
            f"automation covers: it matches nothing; nothing was changed. The deployments are "
            f"{', '.join(sorted(known))} (or * for all of them)."
        )
    return names


def missing_block(reference: str) -> AlertsError:
    """The error for a notification block that does not exist and no URL to make it."""
    return AlertsError(
        f"No notification block {reference!r} on the Prefect server and no webhook URL to make "
        f"it, so no alert can notify; nothing was changed. Give the webhook with --url (or "
        f"${URL_VARIABLE}; for the stack, CIFAR_ALERTS_URL in docker/.env), or name an existing "
        f"block with --block / ${BLOCK_VARIABLE}."
    )


async def apply(
    listed: list[dict[str, Any]],
    block: str,
    within: dict[str, int],
    notify_for: frozenset[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Replace the server's automations of the file's names: (applied, covering none of
    ``notify_for``)."""
    applied, left_out = [], []
    async with get_client() as client:
        for spec in listed:
            made = automation(spec, await _ids(client, spec), block, within, notify_for)
            for old in await client.read_automations_by_name(spec["name"]):
                await client.delete_automation(old.id)
            if made is None:
                left_out.append(spec["name"])
                continue
            kept = await client.create_automation(made)
            for twin in await client.read_automations_by_name(spec["name"]):
                if twin.id != kept:  # made by a first try whose reply was lost
                    await client.delete_automation(twin.id)
            applied.append(spec["name"])
    return applied, left_out


def _seconds(value: str) -> tuple[str, int]:
    name, _, seconds = value.partition("=")
    return name, int(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", default=os.environ.get(BLOCK_VARIABLE) or DEFAULT_BLOCK)
    parser.add_argument("--url", default=os.environ.get(URL_VARIABLE), help="a webhook URL")
    parser.add_argument("--file", type=Path, default=AUTOMATIONS, help="automations file")
    parser.add_argument(
        "--within",
        type=_seconds,
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="another time bound for an automation (e.g. cifar-run-late=60)",
    )
    parser.add_argument(
        "--notify-for",
        default=os.environ.get(DEPLOYMENTS_VARIABLE) or EVERY_DEPLOYMENT,
        metavar="FLOW/DEPLOYMENT,...",
        help="the deployments whose runs notify (default *: every one the file lists)",
    )
    args = parser.parse_args(argv)
    try:
        _apply_all(args)
    except AlertsError as error:
        sys.exit(f"deployments.alerts: {error}")


def _apply_all(args: argparse.Namespace) -> None:
    reference = expanded("--block", BLOCK_VARIABLE, args.block)
    url = expanded("--url", URL_VARIABLE, args.url) if args.url else None
    listed = specs(args.file)
    names = notify_for(expanded("--notify-for", DEPLOYMENTS_VARIABLE, args.notify_for), listed)
    if url:
        webhook_block(reference, url)
    if (block := asyncio.run(block_id(reference))) is None:
        raise missing_block(reference)
    applied, left_out = asyncio.run(apply(listed, block, dict(args.within), names))
    for name in applied:
        print(f"Automation {name!r} applied")
    for name in left_out:
        print(f"Automation {name!r} not applied: it covers none of --notify-for {args.notify_for}")


if __name__ == "__main__":
    main()

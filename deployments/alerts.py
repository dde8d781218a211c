"""Apply deployments/automations.yaml to the Prefect server at $PREFECT_API_URL.

    python -m deployments.alerts --block custom-webhook/cifar-alerts --url https://hooks.example/x

Run after the deployments exist (the compose stack's deploy step runs it): each automation's
``deployments`` are matched by id, so a deployment of the same name in another flow is not
covered. ``--block`` names the Prefect notification block the alerts go through
(``block-type/name``, default ``$CIFAR_ALERTS_BLOCK``); with ``--url`` (default
``$CIFAR_ALERTS_URL``) a ``custom-webhook`` block of that name is created or updated to POST
``{"subject": ..., "body": ...}`` there. Without a block that exists, the automations that
notify are left out, saying so. ``--notify-for`` (``$CIFAR_ALERTS_DEPLOYMENTS``) names the
deployments whose runs notify, every one the file lists by default. Earlier automations of the
same names are replaced: running it again is safe. (Zombie runs are the sentinel's:
``deployments/sentinel.py``.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
DEPLOYMENTS_VARIABLE = "CIFAR_ALERTS_DEPLOYMENTS"  # comma-separated; empty: all the file lists
DEFAULT_BLOCK = "custom-webhook/cifar-alerts"


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
    block: str | None,
    within: dict[str, int],
    notify_for: frozenset[str] | None = None,
) -> AutomationCore | None:
    """The automation ``spec`` describes, matched by ``ids``, notifying through ``block``
    (None: a notifying automation is not made) for the deployments of ``notify_for`` (None:
    all it lists); ``within`` overrides its time bound."""
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
        if block is None:
            return None
        actions.append(
            {
                "type": "send-notification",
                "block_document_id": block,
                "subject": subject,
                "body": body,
            }
        )
    return AutomationCore.model_validate({**spec, "trigger": trigger, "actions": actions})


async def apply(
    path: Path,
    block: str | None,
    within: dict[str, int],
    notify_for: frozenset[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Replace the server's automations of the file's names: (applied, left out)."""
    specs: list[dict[str, Any]] = yaml.safe_load(path.read_text())["automations"]
    applied, left_out = [], []
    async with get_client() as client:
        for spec in specs:
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
        default=os.environ.get(DEPLOYMENTS_VARIABLE, ""),
        metavar="FLOW/DEPLOYMENT,...",
        help="the deployments whose runs notify (default: every one the file lists)",
    )
    args = parser.parse_args(argv)
    names = frozenset(n.strip() for n in args.notify_for.split(",") if n.strip())
    if args.url:
        webhook_block(args.block, args.url)
    block = asyncio.run(block_id(args.block))
    applied, left_out = asyncio.run(apply(args.file, block, dict(args.within), names or None))
    for name in applied:
        print(f"Automation {name!r} applied")
    if left_out:
        print(
            f"No notification block {args.block!r}: left out {', '.join(left_out)}. Create it "
            f"with: python -m deployments.alerts --block {args.block} --url <webhook URL> "
            f"(or set {URL_VARIABLE} for the deploy step), or name an existing block with "
            f"--block / {BLOCK_VARIABLE}.",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()

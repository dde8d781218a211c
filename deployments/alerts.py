"""Apply deployments/automations.yaml to the Prefect server at $PREFECT_API_URL.

    python -m deployments.alerts --block custom-webhook/cifar-alerts --url https://hooks.example/x

``--block`` names a Prefect notification block (``block-type/name``); with ``--url`` a
``custom-webhook`` block of that name is created or updated to POST
``{"subject": ..., "body": ...}`` to the URL. The automations of the file refer to the block by
its id; earlier automations of the same names are replaced, so running it again is safe.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import yaml
from prefect.blocks.core import Block
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore

AUTOMATIONS = Path(__file__).with_name("automations.yaml")
PLACEHOLDER = "BLOCK_DOCUMENT_ID"


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


def automations(block_id: str, path: Path = AUTOMATIONS) -> list[AutomationCore]:
    """The file's automations, notifying through the block with ``block_id``."""
    specs: list[dict[str, Any]] = yaml.safe_load(path.read_text())["automations"]
    for spec in specs:
        for action in spec["actions"]:
            if action.get("block_document_id") == PLACEHOLDER:
                action["block_document_id"] = block_id
    return [AutomationCore.model_validate(spec) for spec in specs]


async def apply(found: list[AutomationCore]) -> None:
    """Replace the server's automations of the same names by ``found``."""
    async with get_client() as client:
        for automation in found:
            for old in await client.read_automations_by_name(automation.name):
                await client.delete_automation(old.id)
            await client.create_automation(automation)
            print(f"Automation {automation.name!r} applied")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", required=True, help="notification block, block-type/name")
    parser.add_argument("--url", help="create or update a custom-webhook block posting here")
    parser.add_argument("--file", type=Path, default=AUTOMATIONS, help="automations file")
    args = parser.parse_args(argv)
    if args.url:
        webhook_block(args.block, args.url)
    block = Block.load(args.block)
    asyncio.run(apply(automations(str(block._block_document_id), args.file)))


if __name__ == "__main__":
    main()

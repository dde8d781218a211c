"""deployments/prefect.yaml against the flows it deploys, without a server: each entrypoint is
a flow, each parameter one of its own, and a default written there only where it differs from
the flow's (the flow's signature holds every default once)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOYMENTS = yaml.safe_load(
    (Path(__file__).parents[2] / "deployments" / "prefect.yaml").read_text()
)["deployments"]


def _flow_defaults(entrypoint: str) -> dict[str, Any]:
    module, name = entrypoint.rsplit(".", 1)
    flow = getattr(importlib.import_module(module), name)
    parameters = inspect.signature(flow.fn).parameters
    return {n: p.default for n, p in parameters.items()}


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_deployment_parameters_are_the_flows_and_differ_from_its_defaults(
    deployment: dict[str, Any],
) -> None:
    defaults = _flow_defaults(deployment["entrypoint"])
    parameters = deployment.get("parameters") or {}
    assert set(parameters) <= set(defaults), (
        f"not parameters of the flow: {set(parameters) - set(defaults)}"
    )
    same = {n: v for n, v in parameters.items() if defaults[n] == v}
    assert same == {}, f"{deployment['name']} repeats the flow's defaults: remove {same}"

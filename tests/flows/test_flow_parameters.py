"""Each flow's parameters are described where users read them: Prefect's parameter schema,
which the UI's run form and `prefect deployment inspect` show, comes from the flows' docstrings
(their ``Args:`` sections)."""

from __future__ import annotations

import inspect
import re

import pytest
from prefect import Flow
from prefect.utilities.callables import parameter_schema

from flows.predict_cifar import predict_cifar
from flows.train_cifar import train_cifar
from flows.tune_cifar import tune_cifar

FLOWS = [train_cifar, tune_cifar, predict_cifar]


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_every_flow_parameter_has_a_description(flow: Flow) -> None:
    properties = parameter_schema(flow.fn).model_dump()["properties"]
    undescribed = [name for name, spec in properties.items() if not spec.get("description")]
    assert undescribed == []


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_flow_docstrings_describe_no_parameter_that_is_gone(flow: Flow) -> None:
    doc = inspect.getdoc(flow.fn) or ""
    args = doc.split("Args:", 1)[1].split("\n\n", 1)[0]
    described = set(re.findall(r"^    (\w+):", args, flags=re.MULTILINE))
    assert described == set(inspect.signature(flow.fn).parameters)

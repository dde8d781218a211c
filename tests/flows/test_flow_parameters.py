"""Each flow's parameters are described where users read them: Prefect's parameter schema,
which the UI's run form and `prefect deployment inspect` show, comes from the flows' docstrings
(their ``Args:`` sections); a default the docs state is the flow's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

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


DOCS = Path(__file__).resolve().parents[2] / "docs"
# "`max_class_drop` (0.02)", "`--dask-worker-timeout-s` (default 60 s)",
# "`promote_margin`** (default 0;"
STATED_DEFAULT = re.compile(r"`(?:--)?([a-z][a-z0-9_-]*)`(?:\*\*)?\s+\((?:default )?([\w.]+)")


def _literal(text: str) -> object:
    """A default as the docs write it: a number, true/false, none; anything else is prose."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _stated_defaults() -> list[tuple[str, str, object]]:
    """(doc, parameter, default) for every flow parameter whose default a doc states."""
    parameters = {name for flow in FLOWS for name in inspect.signature(flow.fn).parameters}
    stated = []
    for doc in sorted(DOCS.glob("*.md")):
        for match in STATED_DEFAULT.finditer(doc.read_text()):
            name = match.group(1).replace("-", "_")
            value = _literal(match.group(2))
            if name in parameters and not isinstance(value, str):
                stated.append((doc.name, name, value))
    return stated


def test_the_docs_state_some_flow_defaults() -> None:
    """The check below reads what it should (a changed wording would leave it checking nothing)."""
    names = {name for _, name, _ in _stated_defaults()}
    assert {"max_class_drop", "min_test_accuracy", "promote_margin"} <= names


@pytest.mark.parametrize(("doc", "name", "value"), _stated_defaults())
def test_a_default_the_docs_state_is_the_flows(doc: str, name: str, value: object) -> None:
    defaults = {
        inspect.signature(flow.fn).parameters[name].default
        for flow in FLOWS
        if name in inspect.signature(flow.fn).parameters
    }
    assert value in defaults, f"{doc} says {name} defaults to {value}; the flows: {defaults}"

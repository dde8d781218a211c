"""The deploy step's alerts command refuses, before it touches the server, what would leave an
alert out without saying why: a compose expression left unexpanded and a deployment filter that
matches nothing. (A missing block, which needs a server: test_alerts_integration.py.)"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from deployments.alerts import (
    AUTOMATIONS,
    AlertsError,
    automation,
    expanded,
    notify_for,
    specs,
)
from tests.deployments.conftest import ALERTS_COMMAND
from tests.prefect_stack import REPO

LISTED = specs(AUTOMATIONS)
DEPLOYMENTS = sorted({name for spec in LISTED for name in spec.get("deployments", [])})
# Every form a compose engine may leave as it is (podman-compose 1.0 keeps ${NAME:-} so).
UNEXPANDED = ["${CIFAR_ALERTS_DEPLOYMENTS:-}", "${X}", "${X-}", "${X:?set X}", "a,${X:-b}"]


@pytest.mark.parametrize("value", ["", "*", " * ", ",", " , "])
def test_an_empty_or_star_filter_means_every_deployment(value: str) -> None:
    assert notify_for(value, LISTED) is None


@pytest.mark.parametrize(
    "value",
    [
        "train-cifar/nightlly",  # a typo
        "nightly",  # the deployment without its flow
        "train-cifar/nightly,tune-cifar/weekley",  # one good, one not
        "TRAIN-CIFAR/NIGHTLY",
        "*,train-cifar/nightly",
    ],
)
def test_a_filter_naming_a_deployment_no_automation_covers_is_refused_naming_it(
    value: str,
) -> None:
    with pytest.raises(AlertsError, match="matches nothing") as refused:
        notify_for(value, LISTED)
    assert all(name in str(refused.value) for name in DEPLOYMENTS)  # what it could have been


@pytest.mark.parametrize("value", UNEXPANDED)
def test_an_unexpanded_compose_expression_is_refused_naming_the_option(value: str) -> None:
    with pytest.raises(AlertsError, match="--notify-for / \\$CIFAR_ALERTS_DEPLOYMENTS"):
        expanded("--notify-for", "CIFAR_ALERTS_DEPLOYMENTS", value)


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_each_deployment_alone_is_covered_by_the_automations_that_list_it(
    deployment: str,
) -> None:
    ids = {name: f"prefect.deployment.{index}" for index, name in enumerate(DEPLOYMENTS)}
    ids["cifar"] = "prefect.work-pool.0"
    names = notify_for(deployment, LISTED)
    made = {spec["name"]: automation(spec, ids, str(uuid.uuid4()), {}, names) for spec in LISTED}
    for spec in LISTED:
        covers = deployment in spec.get("deployments", []) or "work_pool" in spec
        assert (made[spec["name"]] is not None) == covers, spec["name"]
    for made_one in filter(None, made.values()):
        assert [a.type for a in made_one.actions][-1] == "send-notification"


@pytest.mark.integration  # starts a process (tests/process_guard.py)
@pytest.mark.parametrize(
    ("variable", "value", "option"),
    [
        ("CIFAR_ALERTS_DEPLOYMENTS", "${CIFAR_ALERTS_DEPLOYMENTS:-}", "--notify-for"),
        ("CIFAR_ALERTS_BLOCK", "${CIFAR_ALERTS_BLOCK:-}", "--block"),
        ("CIFAR_ALERTS_URL", "${CIFAR_ALERTS_URL:-}", "--url"),
        ("CIFAR_ALERTS_DEPLOYMENTS", "train-cifar/nighty", "--notify-for"),
    ],
)
def test_the_command_exits_non_zero_with_one_line_before_reaching_the_server(
    variable: str, value: str, option: str
) -> None:
    done = subprocess.run(
        ALERTS_COMMAND,
        env=_env(**{variable: value}),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"deployments.alerts: {option} / ${variable}")
    assert "nothing was changed" in lines[0]


def _env(**variables: str) -> dict[str, str]:
    """This environment without the alert variables, but ``variables``; a Prefect server where
    nothing listens (reaching one would fail with another message)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIFAR_ALERTS_")}
    return {**env, "PREFECT_API_URL": "http://127.0.0.1:9/api", **variables}

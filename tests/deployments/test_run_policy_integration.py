"""An insider who may start runs, on a worker with a run policy and the production pool template
(deployments/work-pool.json): what the runs' parameters and job variables cannot reach."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.run_policy import POLICY_VARIABLE
from tests.prefect_stack import REPO, create_pool, start_worker, stop_worker

POOL = "cifar-policed"
DEPLOYMENT = "train-cifar/policed"
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def store(prefect_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A deployment of train-cifar on a pool made from production's template, served by a worker
    whose policy allows reading https:// and writing under the returned folder only."""
    root = tmp_path_factory.mktemp("policed")
    policy = root / "run-policy.toml"
    policy.write_text(f'read = ["https://"]\nwrite = ["{root}/store"]\n')
    env = {
        **prefect_env,
        POLICY_VARIABLE: str(policy),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db",
    }
    create_pool(env, POOL, injectable=False)
    subprocess.run(
        [
            *(sys.executable, "-m", "prefect", "--no-prompt", "deploy"),
            *("flows/train_cifar.py:train_cifar", "--name", "policed", "--pool", POOL),
        ],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    worker = start_worker(env, "policed", root / "worker.log", pool=POOL)
    try:
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            yield root / "store"
    finally:
        stop_worker(worker)


@pytest.mark.parametrize(
    "job_variables",
    [
        {"env": {POLICY_VARIABLE: "/dev/null"}},
        {"command": "sh -c 'env > /tmp/leaked'"},
    ],
    ids=["env", "command"],
)
def test_a_run_may_not_set_its_environment_or_command(
    store: Path, job_variables: dict[str, Any]
) -> None:
    with pytest.raises(Exception) as refused:
        run_deployment(DEPLOYMENT, job_variables=job_variables, timeout=0)
    message = str(refused.value)
    assert "Additional properties are not allowed" in message, message
    assert f"'{next(iter(job_variables))}' was unexpected" in message, message


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ({"data_url": "file:///proc/self/environ"}, "data_url 'file:///proc/self/environ' is not"),
        (
            {"mlflow_tracking_uri": "http://127.0.0.1:9/"},
            "mlflow_tracking_uri 'http://127.0.0.1:9/'",
        ),
    ],
    ids=["environment", "mlflow-elsewhere"],
)
def test_a_run_naming_what_the_policy_refuses_fails_before_anything_is_read(
    store: Path, parameters: dict[str, Any], refused: str
) -> None:
    run = run_deployment(
        DEPLOYMENT,
        parameters={"storage_path": str(store), **parameters},
        timeout=RUN_TIMEOUT_S,
        poll_interval=1,
    )
    assert run.state.is_failed(), run.state
    assert refused in (run.state.message or ""), run.state.message
    assert "is not allowed by the run policy" in run.state.message
    assert not store.exists()

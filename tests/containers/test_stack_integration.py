"""The compose stack for real (podman and podman-compose): images built, services healthy, the
deployments created by the documented one-shot service, train-cifar/manual run on a synthetic
archive in the stack's S3 with its ranks on the compose Dask workers, the model read back from
the host through MLflow's server, and everything kept across `down` and `up`.

Skipped, saying why, where podman, podman-compose or debootstrap is missing (`make test` on a
machine without a container engine); `make test-containers` runs it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILES = ("-f", "docker/docker-compose.yml", "-f", "docker/compose.test.yml")
PROJECT = "cifar-stack-test"
SERVICES = (
    "s3",
    "mlflow",
    "prefect-server",
    "dask-scheduler",
    "dask-worker-1",
    "dask-worker-2",
    "prefect-worker",
)
HEALTH_TIMEOUT_S = 300
RUN_TIMEOUT_S = 900
MODEL = "stack-classifier"

MISSING = [tool for tool in ("podman", "podman-compose", "debootstrap") if not shutil.which(tool)]
pytestmark = [
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"no container engine here ({', '.join(MISSING)} not installed; on Debian: "
        "apt-get install podman podman-compose runc debootstrap)",
    ),
    pytest.mark.timeout(3600),
]


def _env(credentials: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **credentials}


def _compose(credentials: dict[str, str], *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["podman-compose", "-p", PROJECT, *COMPOSE_FILES, *args],
        cwd=REPO,
        env=_env(credentials),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman-compose {' '.join(args)}: {done.stdout}\n{done.stderr}")
    return done.stdout


def _container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def _wait_healthy(services: tuple[str, ...]) -> None:
    """podman runs no healthchecks by itself here (no systemd): run each until it passes."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    for service in services:
        while True:
            check = subprocess.run(
                ["podman", "healthcheck", "run", _container(service)],
                capture_output=True,
                text=True,
            )
            if check.returncode == 0:
                break
            if time.monotonic() > deadline:
                logs = subprocess.run(
                    ["podman", "logs", "--tail", "40", _container(service)],
                    capture_output=True,
                    text=True,
                )
                raise AssertionError(
                    f"{service} not healthy after {HEALTH_TIMEOUT_S} s: {check.stdout}"
                    f"{check.stderr}\n{logs.stdout}{logs.stderr}"
                )
            time.sleep(2)


def _leftovers() -> list[str]:
    found = []
    for kind in ("ps -a", "network ls", "volume ls"):
        out = subprocess.run(
            ["podman", *kind.split(), "--format", "{{.Name}}" if kind != "ps -a" else "{{.Names}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found += [f"{kind}: {name}" for name in out.split() if name.startswith(PROJECT)]
    return found


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    """Images built (cached after the first time), the stack up and healthy, deployments made."""
    subprocess.run(["bash", "docker/build-local.sh"], cwd=REPO, check=True, timeout=3000)
    credentials = {"S3_ACCESS_KEY": "cifar-test", "S3_SECRET_KEY": secrets.token_hex(16)}
    _compose(credentials, "down", "-v", check=False)
    try:
        _compose(credentials, "up", "-d")
        _wait_healthy(SERVICES)
        _compose(credentials, "run", "--rm", "deploy")
        yield credentials
    finally:
        _compose(credentials, "down", "-v", check=False)
        subprocess.run(["podman", "network", "prune", "-f"], capture_output=True)
    assert _leftovers() == []


def _s3(credentials: dict[str, str]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url="http://127.0.0.1:9000",
        key=credentials["S3_ACCESS_KEY"],
        secret=credentials["S3_SECRET_KEY"],
    )


def _run(deployment: str, parameters: dict[str, Any]) -> Any:
    """``prefect deployment run`` through the stack's API, from the host; the final flow run."""
    code = (
        "import json, sys\n"
        "from prefect.deployments import run_deployment\n"
        f"run = run_deployment({deployment!r}, parameters=json.loads(sys.argv[1]), "
        f"timeout={RUN_TIMEOUT_S}, poll_interval=2)\n"
        "print(json.dumps({'id': str(run.id), 'state': run.state.type.value, "
        "'message': run.state.message}))\n"
    )
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:4200/api"}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(parameters)],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def archive(stack: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from cifar.format import write_synthetic_archive

    local = tmp_path_factory.mktemp("archive") / "synthetic.tar.gz"
    md5 = write_synthetic_archive(str(local), images_per_batch=200)
    _s3(stack).put_file(str(local), "cifar/inputs/synthetic.tar.gz")
    return {"data_url": "s3://cifar/inputs/synthetic.tar.gz", "data_md5": md5}


def _train(archive: dict[str, str], **extra: Any) -> Any:
    parameters = {
        **archive,
        "epochs": 1,
        "batch_size": 64,
        "shard_size": 500,
        "registered_model_name": MODEL,
        **extra,
    }
    return _run("train-cifar/manual", parameters)


def _champion() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient("http://127.0.0.1:5000").get_model_version_by_alias(MODEL, "champion")


def test_a_deployment_runs_on_the_stack_and_its_model_is_served_by_mlflow(
    stack: dict[str, str], archive: dict[str, str]
) -> None:
    run = _train(archive)
    assert run["state"] == "COMPLETED", run
    assert _champion().version == "1"
    # The model's files went to the stack's S3 through MLflow's artifact proxy.
    assert _s3(stack).find("mlflow/artifacts"), "no artifacts in s3://mlflow/artifacts"
    # The ranks ran on the compose Dask workers: each keeps its warm rank process afterwards;
    # the Prefect worker never started one.
    for service, expected in (
        ("dask-worker-1", True),
        ("dask-worker-2", True),
        ("prefect-worker", False),
    ):
        assert _runs_rank_processes(service) == expected, service


def _runs_rank_processes(service: str) -> bool:
    top = subprocess.run(
        ["podman", "top", _container(service), "args"],
        capture_output=True,
        text=True,
        check=True,
    )
    return "trainlib._internal.rank.rank_main" in top.stdout


def test_the_stack_keeps_its_data_across_down_and_up(
    stack: dict[str, str], archive: dict[str, str]
) -> None:
    first = _champion()
    _compose(stack, "down")  # no -v: the named volumes stay
    _compose(stack, "up", "-d")
    _wait_healthy(SERVICES)
    assert _champion().version == first.version  # MLflow's registry
    assert _s3(stack).exists(archive["data_url"])  # S3's objects
    run = _train(archive)  # Prefect kept the deployments; the champion is found and compared
    assert run["state"] == "COMPLETED", run
    from mlflow.tracking import MlflowClient

    versions = MlflowClient("http://127.0.0.1:5000").search_model_versions(f"name='{MODEL}'")
    assert sorted(v.version for v in versions) == ["1", "2"]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"data_url": "s3://no-such-bucket/cifar.tar.gz"}, "no-such-bucket"),
        (
            {"dask_address": "tcp://no-such-scheduler:8786", "dask_worker_timeout_s": 5},
            "no-such-scheduler",
        ),
    ],
    ids=["missing-bucket", "unreachable-scheduler"],
)
def test_bad_input_fails_the_run_with_one_clear_message(
    stack: dict[str, str], archive: dict[str, str], parameters: dict[str, Any], message: str
) -> None:
    run = _train(archive, **parameters)
    assert run["state"] == "FAILED", run
    assert message in (run["message"] or ""), run

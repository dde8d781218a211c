"""The compose stack for real (podman and podman-compose): images built, services healthy, the
deployments created by the documented one-shot service, train-cifar/manual run on a synthetic
archive in the stack's S3 with its ranks on the compose Dask workers, the model read back from
the host through MLflow's server, everything kept across `down` and `up` (nightly then finds the
champion), the weekly search with its study on the worker's volume, deployments made from the
host's checkout (predict-cifar/champion on S3 images), and bad input (a missing bucket, an
unreachable scheduler, wrong S3 credentials) failing the run with its message while every
service keeps running.

`make test-containers` runs it (and installs podman where it can). Under `make test` it runs
only where the engine is installed and the stack's images were built here before (then the
build is a cached one, about 30 s); otherwise it is skipped and says why: a first build takes
about 15 minutes and downloads about 3 GB (docs/containers.md, "Tests and CI").
"""

from __future__ import annotations

import hashlib
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

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILES = ("-f", "docker/docker-compose.yml", "-f", "docker/compose.test.yml")
# One project per checkout: a stack left by a killed run here is removed by the next run here,
# and another checkout's stack on this machine is never touched.
PROJECT = f"cifar-stack-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"
SERVICES = (
    "s3",
    "mlflow",
    "prefect-server",
    "dask-scheduler",
    "dask-worker-1",
    "dask-worker-2",
    "prefect-worker",
)
IMAGES = (
    "localhost/debian-py:bookworm",
    "localhost/dask-train-cifar:latest",
    "localhost/dask-train-cifar-s3:latest",
)
# runc and cgroupfs: what this kind of machine needs (docker/podman-containers.conf)
ENGINE_ENV = {
    "CONTAINERS_CONF": os.environ.get(
        "CONTAINERS_CONF", str(REPO / "docker" / "podman-containers.conf")
    )
}
HEALTH_TIMEOUT_S = 300
RUN_TIMEOUT_S = 900
MODEL = "stack-classifier"
RANK_MODULE = "trainlib._internal.rank.rank_main"  # how a rank process shows in `podman top`


def _skip_reason() -> str | None:
    missing = [
        tool for tool in ("podman", "podman-compose", "debootstrap") if not shutil.which(tool)
    ]
    if missing:
        return (
            f"no container engine here ({', '.join(missing)} not installed); as root on Debian, "
            "`make test-containers` installs podman, podman-compose, runc and debootstrap"
        )
    if os.environ.get("CIFAR_CONTAINER_TESTS") == "build":  # make test-containers
        return None
    env = {**os.environ, **ENGINE_ENV}
    absent = [
        image
        for image in IMAGES
        if subprocess.run(["podman", "image", "exists", image], env=env).returncode != 0
    ]
    if absent:
        return (
            f"the stack's images were never built on this machine ({', '.join(absent)} absent): "
            "a first build takes about 15 min and downloads about 3 GB, so `make test` leaves it "
            "out; run `make test-containers` once, then `make test` runs these tests too"
        )
    return None


SKIP_REASON = _skip_reason()
pytestmark = [
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.timeout(3600),
]


def _compose(stack: dict[str, str], *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["podman-compose", "-p", PROJECT, *COMPOSE_FILES, *args],
        cwd=REPO,
        env={**os.environ, **ENGINE_ENV, **stack},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman-compose {' '.join(args)}: {done.stdout}\n{done.stderr}")
    return done.stdout


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        env={**os.environ, **ENGINE_ENV},
        capture_output=True,
        text=True,
        check=check,
    )


def _container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def _wait_healthy(services: tuple[str, ...]) -> None:
    """podman runs no healthchecks by itself here (no systemd): run each until it passes."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    for service in services:
        while True:
            check = _podman("healthcheck", "run", _container(service), check=False)
            if check.returncode == 0:
                break
            if time.monotonic() > deadline:
                logs = _podman("logs", "--tail", "40", _container(service), check=False)
                raise AssertionError(
                    f"{service} not healthy after {HEALTH_TIMEOUT_S} s: {check.stdout}"
                    f"{check.stderr}\n{logs.stdout}{logs.stderr}"
                )
            time.sleep(2)


def _leftovers() -> list[str]:
    found = []
    for kind, field in (
        ("ps -a", "{{.Names}}"),
        ("network ls", "{{.Name}}"),
        ("volume ls", "{{.Name}}"),
    ):
        out = _podman(*kind.split(), "--format", field).stdout
        found += [f"{kind}: {name}" for name in out.split() if name.startswith(PROJECT)]
    return found


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    """Images built (cached after the first time), the stack up and healthy, deployments made.

    The values: the compose environment (S3 credentials, the host ports it publishes)."""
    build = {**os.environ, **ENGINE_ENV}
    subprocess.run(["bash", "docker/build-local.sh"], cwd=REPO, env=build, check=True, timeout=3000)
    stack = {
        "S3_ACCESS_KEY": "cifar-test",
        "S3_SECRET_KEY": secrets.token_hex(16),
        **{
            name: str(free_port())
            for name in ("S3_PORT", "S3_CONSOLE_PORT", "MLFLOW_PORT", "PREFECT_PORT")
        },
        "DASK_DASHBOARD_PORT": str(free_port()),
    }
    _compose(stack, "down", "-v", check=False)
    try:
        _compose(stack, "up", "-d")
        _wait_healthy(SERVICES)
        _compose(stack, "run", "--rm", "deploy")
        yield stack
    finally:
        _compose(stack, "down", "-v", check=False)
        # podman-compose 1.0 leaves the project's network behind; only ours is removed
        _podman("network", "rm", f"{PROJECT}_default", check=False)
    assert _leftovers() == []


def _s3(stack: dict[str, str]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url=f"http://127.0.0.1:{stack['S3_PORT']}",
        key=stack["S3_ACCESS_KEY"],
        secret=stack["S3_SECRET_KEY"],
    )


def _mlflow(stack: dict[str, str]) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"http://127.0.0.1:{stack['MLFLOW_PORT']}")


def _run(
    stack: dict[str, str],
    deployment: str,
    parameters: dict[str, Any],
    env: dict[str, str] | None = None,
) -> Any:
    """``prefect deployment run`` through the stack's API, from the host; the final flow run.

    ``env``: more environment for this run's process in the worker (the work pool's job
    variables, as ``--job-variable`` gives them)."""
    code = (
        "import json, sys\n"
        "from prefect.deployments import run_deployment\n"
        f"run = run_deployment({deployment!r}, parameters=json.loads(sys.argv[1]), "
        f"job_variables=json.loads(sys.argv[2]), timeout={RUN_TIMEOUT_S}, poll_interval=2)\n"
        "print(json.dumps({'id': str(run.id), 'state': run.state.type.value, "
        "'message': run.state.message}))\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            json.dumps(parameters),
            json.dumps({"env": env} if env else {}),
        ],
        env={**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{stack['PREFECT_PORT']}/api"},
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


def _train(
    stack: dict[str, str],
    archive: dict[str, str],
    deployment: str = "train-cifar/manual",
    env: dict[str, str] | None = None,
    **extra: Any,
) -> Any:
    parameters = {
        **archive,
        "epochs": 1,
        "batch_size": 64,
        "shard_size": 500,
        "registered_model_name": MODEL,
        **extra,
    }
    return _run(stack, deployment, parameters, env)


def _runs_rank_processes(service: str) -> bool:
    return RANK_MODULE in _podman("top", _container(service), "args").stdout


def test_a_deployment_runs_on_the_stack_and_its_model_is_served_by_mlflow(
    stack: dict[str, str], archive: dict[str, str]
) -> None:
    run = _train(stack, archive)
    assert run["state"] == "COMPLETED", run
    assert _mlflow(stack).get_model_version_by_alias(MODEL, "champion").version == "1"
    # The host loads the champion through MLflow's artifact proxy (README): the presigned S3
    # URLs MLflow offers name the stack's S3 (http://s3:9000), which only containers resolve.
    code = (
        "import mlflow, numpy as np\n"
        f"model = mlflow.pyfunc.load_model('models:/{MODEL}@champion')\n"
        "print(model.predict(np.zeros((2, 3, 32, 32), dtype=np.uint8)).shape)\n"
    )
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{stack['MLFLOW_PORT']}",
        "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1:] == ["(2, 10)"], done.stderr[-3000:]
    # The model's files went to the stack's S3 through MLflow's artifact proxy, the dataset
    # and the checkpoints to the worker's CIFAR_STORAGE_PATH.
    s3 = _s3(stack)
    assert s3.find("mlflow/artifacts"), "no artifacts in s3://mlflow/artifacts"
    assert s3.find("cifar/data/datasets"), "no dataset under s3://cifar/data"
    # The ranks ran on the compose Dask workers: each keeps its warm rank process afterwards;
    # the Prefect worker never started one.
    for service, expected in (
        ("dask-worker-1", True),
        ("dask-worker-2", True),
        ("prefect-worker", False),
    ):
        assert _runs_rank_processes(service) == expected, service


def test_the_stack_keeps_its_data_across_down_and_up(
    stack: dict[str, str], archive: dict[str, str]
) -> None:
    first = _mlflow(stack).get_model_version_by_alias(MODEL, "champion")
    _compose(stack, "down")  # no -v: the named volumes stay
    _compose(stack, "up", "-d")
    _wait_healthy(SERVICES)
    assert _mlflow(stack).get_model_version_by_alias(MODEL, "champion").version == first.version
    assert _s3(stack).exists(archive["data_url"])
    # Prefect kept the deployments; the scheduled one runs on the stack (its storage is the
    # worker's S3 path, not a folder of the worker) and compares with the first champion.
    run = _train(stack, archive, deployment="train-cifar/nightly")
    assert run["state"] == "COMPLETED", run
    versions = _mlflow(stack).search_model_versions(f"name='{MODEL}'")
    assert sorted(v.version for v in versions) == ["1", "2"]
    second = _mlflow(stack).get_model_version(MODEL, "2")
    assert f"champion version {first.version}" in second.tags.get("promotion", ""), second.tags


def test_the_weekly_search_runs_on_the_stack_with_its_study_on_the_workers_volume(
    stack: dict[str, str], archive: dict[str, str]
) -> None:
    parameters = {
        **archive,
        "num_samples": 2,
        "max_concurrent_trials": 2,
        "epochs": 1,
        "shard_size": 500,
        "search_space": {"lr": ["loguniform", 0.01, 0.1], "batch_size": ["choice", [64]]},
        "registered_model_name": f"{MODEL}-tuned",
    }
    run = _run(stack, "tune-cifar/weekly", parameters)
    assert run["state"] == "COMPLETED", run
    assert _mlflow(stack).get_model_version_by_alias(f"{MODEL}-tuned", "champion").version == "1"
    study = _podman("exec", _container("prefect-worker"), "ls", "-l", "/studies").stdout
    assert "optuna.db" in study, study


def test_deployments_made_from_a_checkout_on_the_host_run_in_the_stack(
    stack: dict[str, str],
) -> None:
    """What a user does from a clone: the deployer's folder does not exist in the worker."""
    import io

    import numpy as np
    from PIL import Image

    prefect = str(Path(sys.executable).parent / "prefect")
    subprocess.run(
        [prefect, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
        cwd=REPO,
        env={**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{stack['PREFECT_PORT']}/api"},
        check=True,
        capture_output=True,
        timeout=300,
    )
    s3 = _s3(stack)
    for index in range(3):
        png = io.BytesIO()
        Image.fromarray(np.full((32, 32, 3), 60 * index, dtype=np.uint8)).save(png, "PNG")
        s3.pipe(f"cifar/inputs/images/{index}.png", png.getvalue())
    s3.pipe("cifar/inputs/images/broken.png", b"not a png")
    parameters = {
        "input_uri": "s3://cifar/inputs/images",
        "output_uri": "s3://cifar/predictions/host.csv",
        "model_name": MODEL,
    }
    run = _run(stack, "predict-cifar/champion", parameters)
    assert run["state"] == "COMPLETED", run
    rows = s3.cat("cifar/predictions/host.csv").decode().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == [
        f"s3://cifar/inputs/images/{index}.png" for index in range(3)
    ]
    assert "broken.png" in s3.cat("cifar/predictions/host.errors.csv").decode()


@pytest.mark.parametrize(
    ("parameters", "env", "message"),
    [
        ({"data_url": "s3://no-such-bucket/cifar.tar.gz"}, None, "no-such-bucket"),
        (
            {"dask_address": "tcp://no-such-scheduler:8786", "dask_worker_timeout_s": 5},
            None,
            "no-such-scheduler",
        ),
        ({}, {"AWS_SECRET_ACCESS_KEY": "not-the-secret-42"}, "Cannot write under storage_path"),
    ],
    ids=["missing-bucket", "unreachable-scheduler", "wrong-s3-credentials"],
)
def test_bad_input_fails_the_run_with_one_clear_message(
    stack: dict[str, str],
    archive: dict[str, str],
    parameters: dict[str, Any],
    env: dict[str, str] | None,
    message: str,
) -> None:
    run = _train(stack, archive, env=env, **parameters)
    assert run["state"] == "FAILED", run
    assert message in (run["message"] or ""), run
    assert "not-the-secret-42" not in (run["message"] or "")


def test_no_service_restarted_or_stopped_after_the_failed_runs(stack: dict[str, str]) -> None:
    states = {
        service: _podman(
            "inspect", "--format", "{{.State.Status}} {{.RestartCount}}", _container(service)
        ).stdout.strip()
        for service in SERVICES
    }
    assert states == {service: "running 0" for service in SERVICES}

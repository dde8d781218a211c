"""docker/ without a Docker engine: the compose schema, its cross-references, hadolint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = DOCKER / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is not installed; run `make test` (it installs the dev tools)"
    return found


def test_compose_matches_the_compose_spec() -> None:
    done = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_references_resolve() -> None:
    compose = _compose()
    services = compose["services"]
    volumes = compose.get("volumes") or {}
    problems = []
    for name, service in services.items():
        depends = service.get("depends_on") or []
        problems += [f"{name}: depends_on {d}" for d in depends if d not in services]
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "~", "$")) and source not in volumes:
                problems.append(f"{name}: volume {source} undeclared")
        build = service.get("build")
        if build is not None:
            context = DOCKER / build["context"]
            if not (context / build["dockerfile"]).is_file():
                problems.append(f"{name}: no {build['dockerfile']} under {context}")
    assert problems == []


def test_compose_has_the_whole_stack() -> None:
    services = _compose()["services"]
    assert {
        "s3",
        "mlflow",
        "prefect-server",
        "prefect-worker",
        "dask-scheduler",
        "dask-worker-1",
        "dask-worker-2",
    } <= set(services)
    worker_env = services["prefect-worker"]["environment"]
    assert worker_env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert worker_env["DASK_SCHEDULER_ADDRESS"] == "tcp://dask-scheduler:8786"
    assert "--artifacts-destination s3://mlflow/artifacts" in services["mlflow"]["command"]


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "error", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

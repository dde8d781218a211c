"""docker/ without a Docker engine: the compose schema, its cross-references, hadolint."""

from __future__ import annotations

import re
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


# scheme://[user:password@]host:port, e.g. http://mlflow:5000 or tcp://dask-scheduler:8786
SERVICE_URL = re.compile(r"[a-z][a-z0-9+]*://(?:[^@/\s]*@)?([A-Za-z0-9_.-]+):\d+")


def _strings(value: Any) -> list[str]:
    """The strings of an environment (mapping or list) or a command (string or list)."""
    if isinstance(value, dict):
        return [str(v) for v in value.values()]
    if isinstance(value, list):
        return [str(v) for v in value]
    return [value] if isinstance(value, str) else []


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
        for text in _strings(service.get("environment")) + _strings(service.get("command")):
            for host in SERVICE_URL.findall(text):
                if host not in services and host not in ("localhost", "127.0.0.1"):
                    problems.append(f"{name}: {text} names no service")
        build = service.get("build")
        if build is not None:
            context = DOCKER / build["context"]
            if not (context / build["dockerfile"]).is_file():
                problems.append(f"{name}: no {build['dockerfile']} under {context}")
    assert problems == []


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "error", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

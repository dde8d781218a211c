"""docker/ without a Docker engine: the compose schema, its cross-references, hadolint."""

from __future__ import annotations

import os
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
SERVICE_URL = re.compile(r"[a-z][a-z0-9+]*://(?:[^@/\s]*@)?([A-Za-z0-9_.-]+):(\d+)")
# what a service listens on, as its command says: --port 5000, -s3.port=9000, --host 0.0.0.0
# --dashboard-address :8787, --console-address :9001
LISTEN = re.compile(r"-[\w.-]*(?:port|address)[= ](?:[^\s:]*:)?(\d+)\b")
# wait-for's dependencies: host:port, postgres://host:port, http://host:port/path
WAIT_FOR = re.compile(r"wait-for ((?:\S+ )+?)-- ")
DEPENDENCY = re.compile(r"(?:[a-z]+://)?([\w.-]+):(\d+)")


def _strings(value: Any) -> list[str]:
    """The strings of an environment (mapping or list) or a command (string or list)."""
    if isinstance(value, dict):
        return [str(v) for v in value.values()]
    if isinstance(value, list):
        return [str(v) for v in value]
    return [value] if isinstance(value, str) else []


def _listens_on(service: dict[str, Any]) -> set[int]:
    """The container ports a service listens on: published ones, exposed ones, and the ports
    its command and its healthcheck name."""
    ports = {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports") or []}
    ports |= {int(str(p)) for p in service.get("expose") or []}
    command = " ".join(_strings(service.get("command")) + _strings(service.get("entrypoint")))
    ports |= {int(p) for p in LISTEN.findall(command)}
    health = " ".join(_strings((service.get("healthcheck") or {}).get("test")))
    ports |= {int(p) for p in re.findall(r"localhost[:', ]+(\d+)", health)}
    return ports


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
        texts = _strings(service.get("environment")) + _strings(service.get("command"))
        texts += _strings(service.get("entrypoint"))
        targets = [t for text in texts for t in SERVICE_URL.findall(text)]
        targets += [
            DEPENDENCY.match(target).groups()  # type: ignore[union-attr]
            for text in texts
            for found in WAIT_FOR.findall(text)
            for target in found.split()
        ]
        for host, port in targets:
            if host in ("localhost", "127.0.0.1"):
                continue
            if host not in services:
                problems.append(f"{name}: {host}:{port} names no service")
            elif int(port) not in _listens_on(services[host]):
                problems.append(f"{name}: {host} does not listen on {port}")
        build = service.get("build")
        if build is not None:
            context = DOCKER / build["context"]
            if not (context / build["dockerfile"]).is_file():
                problems.append(f"{name}: no {build['dockerfile']} under {context}")
    assert problems == []


# Which servers each service reaches, and through which setting (an environment variable, or
# "command" for its command line): a URL removed from the file fails here.
REACHES = {
    "mlflow": {"MLFLOW_S3_ENDPOINT_URL": "s3"},
    "dask-worker-1": {"command": "dask-scheduler", "AWS_ENDPOINT_URL_S3": "s3"},
    "dask-worker-2": {"command": "dask-scheduler", "AWS_ENDPOINT_URL_S3": "s3"},
    "prefect-worker": {
        "PREFECT_API_URL": "prefect-server",
        "MLFLOW_TRACKING_URI": "mlflow",
        "DASK_SCHEDULER_ADDRESS": "dask-scheduler",
        "AWS_ENDPOINT_URL_S3": "s3",
        "CIFAR_STUDY_STORAGE": "postgres",
    },
    "deploy": {"PREFECT_API_URL": "prefect-server", "MLFLOW_TRACKING_URI": "mlflow"},
}


def test_compose_each_client_names_the_servers_it_uses() -> None:
    services = _compose()["services"]
    found = {}
    for name, settings in REACHES.items():
        environment = services[name].get("environment") or {}
        for setting in settings:
            if setting == "command":
                text = " ".join(_strings(services[name]["command"]))
            else:
                text = str(environment.get(setting, ""))
            found[(name, setting)] = {host for host, _ in SERVICE_URL.findall(text)}
    assert found == {
        (name, setting): {server}
        for name, settings in REACHES.items()
        for setting, server in settings.items()
    }


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "error", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_test_file_gives_every_service_of_the_image_a_local_image() -> None:
    """Where no registry is reachable, a service left out of compose.test.yml would be built
    (or pulled) under another tag, and the stack would come up without it."""
    services = _compose()["services"]
    local = yaml.safe_load((DOCKER / "compose.test.yml").read_text())["services"]
    built = {name for name, service in services.items() if "build" in service}
    assert built - set(local) == set()
    # and the image of the same target: a service without torch given the training image
    # would run, but the services' image would not be what the tests try
    local_images = {
        "app": "localhost/dask-train-cifar:latest",
        "services": "localhost/dask-train-cifar-services:latest",
    }
    wrong = {
        name: local[name]["image"]
        for name in built
        if local[name]["image"] != local_images[services[name]["build"]["target"]]
    }
    assert wrong == {}


def test_compose_a_dask_worker_is_on_one_network_only() -> None:
    """A Dask worker listens on the address it finds towards the scheduler; on two networks,
    a name lookup failing at its start picked the other network's address, unreachable from
    the scheduler (seen after a restart: every later run timed out connecting to it)."""
    services = _compose()["services"]
    workers = {
        n: s["networks"] for n, s in services.items() if "dask worker" in str(s.get("command"))
    }
    assert len(workers) == 2
    assert all(len(networks) == 1 for networks in workers.values()), workers


def test_compose_every_server_a_service_names_shares_a_network_with_it() -> None:
    """The networks are the only way between services: a server named on a service's command
    line or in its environment (URLs, ``wait-for host:port``) must be on one of its networks."""
    services = _compose()["services"]
    address = re.compile(r"\b([a-z][a-z0-9-]*):(\d+)\b")
    problems = []
    for name, service in services.items():
        environment = service.get("environment") or {}
        text = " ".join([*_strings(service.get("command", "")), *map(str, environment.values())])
        named = {host for host, _ in address.findall(text) if host in services and host != name}
        networks = set(service.get("networks") or ["default"])
        for server in sorted(named):
            if not networks & set(services[server].get("networks") or ["default"]):
                problems.append(f"{name} names {server} but shares no network with it")
    assert problems == []


def test_compose_prefect_server_orders_events_as_the_test_servers_do() -> None:
    """The stack's Prefect server imports the event ordering the test servers run
    (deployments/event_ordering.py) from the image's /app, where the Dockerfile copies it."""
    from tests.prefect_stack import EVENT_ORDERING

    server = _compose()["services"]["prefect-server"]["environment"]
    assert server["PREFECT_SERVER_EVENTS_CAUSAL_ORDERING"] == EVENT_ORDERING
    assert server["PYTHONPATH"] == "/app"
    module = Path(*EVENT_ORDERING.split(".")).with_suffix(".py")
    assert (DOCKER.parent / module).is_file()
    assert f"COPY {module.parts[0]} /app/{module.parts[0]}" in (DOCKER / "Dockerfile").read_text()


# ${NAME}, ${NAME:-default} with a default, ${NAME:?message}: what Docker Compose and
# podman-compose 1.0 expand alike (podman-compose leaves ${NAME:-} and ${NAME-x} as they are).
PORTABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]+|:\?[^}]+)?\}")
INTERPOLATION = re.compile(r"\$\{[^}]*\}?")


def test_compose_uses_only_interpolation_both_engines_expand() -> None:
    for path in (COMPOSE, DOCKER / "compose.test.yml"):
        text = re.sub(r"\$\$", "", path.read_text())  # $$: a literal dollar, not expanded
        found = INTERPOLATION.findall(text)
        assert found or path != COMPOSE  # the check reads what it checks
        assert [e for e in found if not PORTABLE.fullmatch(e)] == [], path.name


def test_build_local_takes_its_sources_from_the_host_or_the_user(tmp_path: Path) -> None:
    """docker/build-local.sh names no package host, mirror or machine folder: the indexes come
    from the host's pip configuration (a local index mounted into the build) or the user's
    variables, the Debian mirror from DEBIAN_MIRROR (else the host's apt sources)."""
    script = (DOCKER / "build-local.sh").read_text()
    for named in ("/opt/", "deb.debian.org", "pypi.org", "pypi-more"):
        assert named not in script, f"build-local.sh names {named}"
    local = tmp_path / "mirror"
    (tmp_path / "pip.conf").write_text(
        f"[global]\nextra-index-url = file://{local}/simple https://index.example/simple\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": str(tmp_path / "pip.conf"),
    }

    def sources(**more: str) -> str:
        done = subprocess.run(
            ["bash", str(DOCKER / "build-local.sh"), "--show-sources"],
            env={**env, **more},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    shown = sources(DEBIAN_MIRROR="http://debian.example/debian")
    assert "debian mirror: http://debian.example/debian\n" in shown
    assert f"PIP_EXTRA_INDEX_URL=file://{local}/simple https://index.example/simple" in shown
    assert f"TORCH_INDEX_URL=file://{local}/simple" in shown  # torch from the host's indexes
    assert f"-v {local}:{local}:ro" in shown and "index.example:" not in shown
    chosen = sources(
        PIP_INDEX_URL="https://chosen.example/simple", TORCH_INDEX_URL="https://torch.example/cpu"
    )
    assert "PIP_INDEX_URL=https://chosen.example/simple" in chosen
    assert "TORCH_INDEX_URL=https://torch.example/cpu" in chosen
    env["PIP_CONFIG_FILE"] = os.devnull  # a host with no pip configuration: pip's defaults
    bare = sources()
    assert "INDEX_URL" not in bare and bare.endswith(
        "build flags: -v /etc/ssl/certs:/etc/ssl/certs:ro\n"
    )

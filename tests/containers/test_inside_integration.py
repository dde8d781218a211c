"""The stack's inside, attacked as a compromised container would: each service reaches only the
services it needs (by name and by address), SeaweedFS's filer, master and volume server are out
of reach and its gRPC wants the stack's certificate, the Dask scheduler refuses a client without
the Dask certificate, every container runs hardened (no capabilities but those it needs, no
privilege gain, bounded processes, memory and logs, read-only where the service allows), the
services that run no model have no torch, and no secret is on a command line, in
``podman inspect``, in a URL of a process environment, or in a process that does not use it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers.stack import REPO, SERVICES, Stack, container, podman, skip_reason

SKIP_REASON = skip_reason()
pytestmark = [
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.timeout(900),
]

# Run inside a container: for each "host:port", whether a TCP connection opens.
_CONNECT = """
import json, socket, sys
found = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        found[target] = "open"
    except socket.gaierror:
        found[target] = "unresolved"
    except OSError as error:
        found[target] = type(error).__name__
print(json.dumps(found))
"""


def _connect(service: str, *targets: str) -> dict[str, str]:
    done = podman("exec", container(service), "python", "-c", _CONNECT, *targets)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _address(service: str) -> str:
    """One of the service's addresses on its networks."""
    networks = json.loads(
        podman(
            "inspect", container(service), "--format", "{{json .NetworkSettings.Networks}}"
        ).stdout
    )
    return str(next(iter(networks.values()))["IPAddress"])


@pytest.mark.parametrize(
    ("service", "reaches", "never"),
    [
        (
            "dask-worker-1",
            ["s3:9000", "dask-scheduler:8786", "dask-worker-2:8788"],
            ["postgres:5432", "mlflow:5000", "prefect-server:4200", "s3:8888", "s3:9333",
             "s3:8080"],
        ),
        (
            "mlflow",
            ["postgres:5432", "s3:9000"],
            ["dask-scheduler:8786", "prefect-server:4200", "s3:8888"],
        ),
        ("prefect-server", ["postgres:5432"], ["s3:9000", "mlflow:5000", "dask-scheduler:8786"]),
        ("sentinel", ["prefect-server:4200", "dask-scheduler:8787"], ["postgres:5432"]),
    ],
)  # fmt: skip
def test_each_service_reaches_only_what_it_needs(
    stack: Stack, service: str, reaches: list[str], never: list[str]
) -> None:
    by_name = _connect(service, *reaches, *never)
    assert {t: by_name[t] for t in reaches} == dict.fromkeys(reaches, "open")
    assert [t for t in never if by_name[t] == "open"] == []
    # nor by address: the networks are apart, not merely unnamed
    by_address = [f"{_address(t.split(':')[0])}:{t.split(':')[1]}" for t in never]
    assert [t for t, how in _connect(service, *by_address).items() if how == "open"] == []


_GRPC_WITHOUT_CERTIFICATE = """
import socket, ssl
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
context.set_alpn_protocols(["h2"])
with socket.create_connection(("s3", 19000), timeout=5) as raw:
    try:
        with context.wrap_socket(raw) as tls:
            tls.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n")
            print("answered", tls.recv(100))
    except ssl.SSLError as error:
        print("refused", error.reason)
"""


def test_seaweedfs_grpc_refuses_a_caller_without_the_stack_certificate(stack: Stack) -> None:
    done = podman("exec", container("dask-worker-1"), "python", "-c", _GRPC_WITHOUT_CERTIFICATE)
    assert done.stdout.strip() == "refused TLSV13_ALERT_CERTIFICATE_REQUIRED", done.stdout


_DASK_CLIENT = """
import sys
from distributed import Client
try:
    with Client(sys.argv[1], timeout=10) as client:
        print("connected", len(client.scheduler_info()["workers"]))
except Exception as error:
    print("refused", type(error).__name__)
"""


def test_the_dask_scheduler_refuses_a_client_without_the_dask_certificate(stack: Stack) -> None:
    def client(service: str, address: str) -> str:
        done = podman("exec", container(service), "python", "-c", _DASK_CLIENT, address)
        return done.stdout.strip().splitlines()[-1]

    assert client("prefect-worker", "tls://dask-scheduler:8786") == "connected 2"
    # the sentinel is on the Dask network (it watches the dashboard) and holds no key (only the
    # certificates, whose expiry it watches)
    assert client("sentinel", "tls://dask-scheduler:8786").startswith("refused")
    assert client("sentinel", "tcp://dask-scheduler:8786").startswith("refused")


POSTGRES_CAPS = {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETUID", "CAP_SETGID"}


def test_prefect_cache_records_are_out_of_the_dask_workers_reach(stack: Stack) -> None:
    """A flow unpickles a cache record it finds: the Dask workers' key (the data key) can
    neither write one nor read one; the Prefect worker's own key can."""
    data, own = stack.s3(), stack.s3("PREFECT")
    with pytest.raises(PermissionError):
        data.pipe("prefect/cache/poisoned", b"a pickle that runs code")
    with pytest.raises(PermissionError):
        data.ls("prefect")
    own.pipe("prefect/probe", b"x")
    assert own.cat("prefect/probe") == b"x"
    own.rm("prefect/probe")


READ_ONLY = {"mlflow", "prefect-server", "dask-scheduler", "sentinel"}
WRITING = {"postgres", "s3", "dask-worker-1", "dask-worker-2", "prefect-worker"}


@pytest.mark.parametrize("service", sorted(READ_ONLY | WRITING))
def test_every_container_is_hardened(stack: Stack, service: str) -> None:
    [found] = json.loads(podman("inspect", container(service)).stdout)
    host: dict[str, Any] = found["HostConfig"]
    caps = set(found["EffectiveCaps"] or [])
    # postgres's entrypoint owns its data folder and becomes the postgres user (the compose file)
    allowed = POSTGRES_CAPS if service == "postgres" else set()
    assert caps <= allowed
    assert any(o.startswith("no-new-privileges") for o in host["SecurityOpt"] or [])
    assert host["Memory"] > 0
    assert host["PidsLimit"] > 0
    assert host["LogConfig"]["Size"] not in ("", "0B", None)
    assert host["ReadonlyRootfs"] is (service in READ_ONLY)


# the training image's services; the others run the services' image, without torch
TRAINING = {"dask-worker-1", "dask-worker-2", "prefect-worker"}


@pytest.mark.parametrize("service", sorted(TRAINING | READ_ONLY))
def test_only_the_services_that_train_have_torch(stack: Stack, service: str) -> None:
    code = "import importlib.util as u; print(u.find_spec('torch') is not None)"
    found = podman("exec", container(service), "python", "-c", code).stdout.strip()
    assert found == str(service in TRAINING)


def _processes(service: str) -> list[tuple[str, dict[str, str]]]:
    """Each process of the service's container: its command line and its environment, read
    from the host's /proc (the container's own user may not read another user's)."""
    found = []
    for pid in podman("top", container(service), "hpid").stdout.split()[1:]:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:  # ended since
            continue
        pairs = (item.decode(errors="replace").partition("=") for item in environ if item)
        found.append((command.decode(errors="replace"), {k: v for k, _, v in pairs}))
    return found


def test_no_secret_is_on_a_command_line_in_inspect_or_where_it_is_not_used(stack: Stack) -> None:
    """Every secret value of the stack (passwords, keys, the alert URL) searched for in every
    container's configuration and in every process's command line and environment: a process
    holds only the secrets its service mounts, and none inside a URL."""
    secrets = {n: v for n, v in stack.env.items() if n.endswith(("PASSWORD", "_KEY", "_URL"))}
    folder = Path(stack.env["CIFAR_SECRETS_DIR"])
    mounted = yaml.safe_load((REPO / "docker" / "docker-compose.yml").read_text())["services"]
    problems = []
    running = [s for s, c in mounted.items() if c.get("restart") != "no" and "profiles" not in c]
    assert set(SERVICES) <= set(running)
    for service in running:
        inspected = podman("inspect", container(service)).stdout
        problems += [
            f"{service}: {n} in podman inspect" for n, v in secrets.items() if v in inspected
        ]
        files = "".join((folder / f).read_text() for f in mounted[service].get("secrets", []))
        for command, environ in _processes(service):
            problems += [
                f"{service}: {n} on a command line" for n, v in secrets.items() if v in command
            ]
            for variable, value in environ.items():
                for name, secret in secrets.items():
                    if secret not in value:
                        continue
                    if secret not in files:
                        problems.append(f"{service}: {name} in {variable}, not its secret")
                    if re.search(r"\w+://", value) and variable != name:
                        problems.append(f"{service}: {name} inside a URL ({variable})")
    assert sorted(set(problems)) == []

"""The compose stack for real (podman and podman-compose), as a platform team runs it: images
built, every variable of docker/.env.example set to fresh random values, services healthy, the
one-shot deploy (MLflow's training account, the work pool, the deployments) run; then every
published API refuses a request without credentials, train-cifar/manual trains on the stack's
Dask workers with each service's own scoped key, a forbidden cluster class is refused, Postgres
restarts under an idle stack and every service reconnects, nightly and weekly run after `down`
and `up` (the search's study in Postgres), deployments made from the host run, bad input fails
cleanly, no secret is in any log, and a pg_dump restored into fresh volumes brings back the
registry and the flow-run history.

`make test-containers` runs it (and installs podman where it can). Under `make test` it runs
only where the engine is installed and the stack's images were built here before (then the
build is a cached one, about 30 s); otherwise it is skipped and says why: a first build takes
about 15 minutes and downloads about 3 GB (docs/containers.md, "Tests and CI").
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from mlflow.exceptions import MlflowException

from tests.containers.stack import (
    COMPOSE_FILES,
    DATABASES,
    ENGINE_ENV,
    MODEL,
    PROJECT,
    REPO,
    SERVICES,
    Stack,
    container,
    deployment_version,
    pg_dump,
    pg_restore,
    podman,
    psql,
    run_deployment,
    skip_reason,
    start_run,
    up,
    wait_healthy,
)

SKIP_REASON = skip_reason()
pytestmark = [
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.timeout(3600),
]
RANK_MODULE = "trainlib._internal.rank.rank_main"  # how a rank process shows in `podman top`


@pytest.fixture(autouse=True)
def _host_credentials_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)


@pytest.fixture(scope="module")
def archive(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from cifar.format import write_synthetic_archive

    local = tmp_path_factory.mktemp("archive") / "synthetic.tar.gz"
    md5 = write_synthetic_archive(str(local), images_per_batch=200)
    stack.s3().put_file(str(local), "cifar/inputs/synthetic.tar.gz")
    return {"data_url": "s3://cifar/inputs/synthetic.tar.gz", "data_md5": md5}


def _train(
    stack: Stack,
    archive: dict[str, str],
    deployment: str = "train-cifar/manual",
    **extra: Any,
) -> dict[str, Any]:
    parameters = {**archive, "epochs": 1, "batch_size": 64, "rows_per_file": 500, **extra}
    return run_deployment(stack, deployment, {"registered_model_name": MODEL, **parameters})


def _status(url: str, **headers: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as error:
        return error.code


def test_every_published_api_refuses_a_request_without_credentials(stack: Stack) -> None:
    prefect = stack.prefect_env["PREFECT_API_URL"]
    assert _status(f"{prefect}/deployments/filter") in (401, 405)  # any route: 401 first
    assert _status(f"{prefect}/admin/version") == 401
    assert _status(f"{prefect}/health") == 200  # the probes only
    assert _status(f"{stack.mlflow_url}/") == 401  # MLflow's UI
    assert _status(f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1") == 401
    s3 = f"http://127.0.0.1:{stack.env['S3_PORT']}"
    assert _status(f"{s3}/cifar/") == 403  # S3: no signature, nothing listed
    with pytest.raises(PermissionError):  # the data key cannot touch MLflow's bucket
        stack.s3().pipe("mlflow/not-allowed.txt", b"x")


# One credential of each kind: a PostgreSQL role, MLflow's admin, an S3 identity, Prefect's
# auth string. The tests after this one run on the new values.
ROTATED = ("PREFECT_DB_PASSWORD", "MLFLOW_ADMIN_PASSWORD", "S3_DATA_SECRET_KEY",
           "PREFECT_ADMIN_PASSWORD")  # fmt: skip


def _logs_in_to_postgres(role: str, password: str) -> bool:
    """Whether ``role`` logs in with ``password`` over TCP (the password on stdin)."""
    login = 'read -r p; PGPASSWORD="$p" psql -h localhost -U "$1" -d "$1" -Atc "select 1"'
    done = podman(
        "exec", "-i", container("postgres"), "sh", "-c", login, "sh", role,
        check=False, input=password + "\n",
    )  # fmt: skip
    return done.returncode == 0


def test_one_credential_of_each_kind_is_rotated_by_one_command(stack: Stack) -> None:
    old = dict(stack.env)
    new = {**old, **{name: old[name][::-1] + "r" for name in ROTATED}}
    done = subprocess.run(
        [sys.executable, "docker/rotate_secrets.py", "podman-compose", "-p", PROJECT,
         *COMPOSE_FILES],
        cwd=REPO, env={**os.environ, **ENGINE_ENV, **new}, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert [v for v in new.values() if v in done.stdout + done.stderr] == []
    stack.env.update(new)  # the stack's clients in the tests after this one
    wait_healthy(SERVICES)
    assert _logs_in_to_postgres("prefect", new["PREFECT_DB_PASSWORD"])
    assert not _logs_in_to_postgres("prefect", old["PREFECT_DB_PASSWORD"])
    assert stack.mlflow("ADMIN").search_experiments() != []
    with pytest.raises(MlflowException, match="401"):
        Stack(old).mlflow("ADMIN").search_experiments()
    stack.s3().pipe("cifar/rotated", b"x")
    assert stack.s3().cat("cifar/rotated") == b"x"
    with pytest.raises(PermissionError):
        Stack(old).s3().cat("cifar/rotated")
    prefect = stack.prefect_env["PREFECT_API_URL"] + "/admin/version"
    assert (
        _status(
            prefect, Authorization=_basic(new["PREFECT_ADMIN_USER"], new["PREFECT_ADMIN_PASSWORD"])
        )
        == 200
    )
    assert (
        _status(
            prefect, Authorization=_basic(old["PREFECT_ADMIN_USER"], old["PREFECT_ADMIN_PASSWORD"])
        )
        == 401
    )
    # the restarted Dask workers are reachable from the scheduler (a worker on two networks
    # once came back on the other one's address: every run then timed out connecting to it)
    ran = podman("exec", container("prefect-worker"), "python", "-c", _WORKERS_REACHED)
    assert ran.stdout.strip().splitlines()[-1] == "2", ran.stdout + ran.stderr
    # and once more: every credential already the one the stack runs on, nothing restarted
    again = subprocess.run(
        [sys.executable, "docker/rotate_secrets.py", "podman-compose", "-p", PROJECT,
         *COMPOSE_FILES],
        cwd=REPO, env={**os.environ, **ENGINE_ENV, **new}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "every credential is already the one the stack runs on" in again.stdout, again.stderr


# Run in the Prefect worker: how many Dask workers the scheduler reaches (runs a task on)
_WORKERS_REACHED = """
from distributed import Client
with Client("tls://dask-scheduler:8786", timeout=30) as client:
    answers = client.run(lambda: "here", on_error="return")
print(sum(answer == "here" for answer in answers.values()))
"""


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_deployment_trains_on_the_stack_with_least_privilege(
    stack: Stack, archive: dict[str, str]
) -> None:
    run = _train(stack, archive)
    assert run["state"] == "COMPLETED", run
    client = stack.mlflow()
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.version == "1"
    # the code's commit: on the run, and as the version of the deployment that ran it
    assert client.get_run(champion.run_id).data.tags["git_sha"] == stack.env["GIT_SHA"]
    assert deployment_version(stack, "train-cifar/manual") == stack.env["GIT_SHA"]
    with pytest.raises(MlflowException, match="403"):  # the training account deletes nothing
        client.delete_registered_model(MODEL)
    # Prefect's cache records went to their own bucket, none beside the data
    assert stack.s3("PREFECT").find("prefect/cache") != []
    assert not stack.s3().exists("cifar/data/cache")
    # The host loads the champion through MLflow's artifact proxy (README).
    code = (
        "import mlflow, numpy as np\n"
        f"model = mlflow.pyfunc.load_model('models:/{MODEL}@champion')\n"
        "print(model.predict(np.zeros((2, 3, 32, 32), dtype=np.uint8)).shape)\n"
    )
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": stack.mlflow_url,
        "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1:] == ["(2, 10)"], done.stderr[-3000:]
    # the ranks ran on the compose Dask workers, never in the Prefect worker
    for service, expected in (
        ("dask-worker-1", True),
        ("dask-worker-2", True),
        ("prefect-worker", False),
    ):
        ranks = RANK_MODULE in podman("top", container(service), "args").stdout
        assert ranks == expected, service


def test_a_cluster_class_the_operator_did_not_allow_is_refused(
    stack: Stack, archive: dict[str, str]
) -> None:
    run = _train(
        stack,
        archive,
        dask_cluster_class="subprocess.Popen",
        dask_cluster_kwargs={"args": ["touch", "/tmp/pwned"]},
    )
    assert run["state"] == "FAILED", run
    assert "'subprocess.Popen' is not allowed here" in run["message"], run
    assert podman("exec", container("prefect-worker"), "ls", "/tmp/pwned", check=False).returncode


def test_every_service_reconnects_after_postgres_restarts_under_an_idle_stack(
    stack: Stack, archive: dict[str, str]
) -> None:
    podman("restart", container("postgres"))
    wait_healthy(("postgres",))
    # the data, commit and options of the champion: force, or it would end without training
    run = _train(stack, archive, deployment="train-cifar/nightly", force=True)
    assert run["state"] == "COMPLETED", run
    second = stack.mlflow().get_model_version(MODEL, "2")
    assert "champion version 1" in second.tags.get("promotion", ""), second.tags


def test_the_stack_keeps_its_state_across_down_and_up_and_searches_with_postgres(
    stack: Stack, archive: dict[str, str]
) -> None:
    stack.compose("down")  # no -v: the named volumes stay
    up(stack)
    assert stack.mlflow().get_model_version_by_alias(MODEL, "champion").version == "1"
    assert stack.s3().exists(archive["data_url"])
    parameters = {
        **archive,
        "num_samples": 2,
        "max_concurrent_trials": 2,
        "epochs": 1,
        "rows_per_file": 500,
        "search_space": {"lr": ["loguniform", 0.01, 0.1], "batch_size": ["choice", [64]]},
        "registered_model_name": f"{MODEL}-tuned",
    }
    run = run_deployment(stack, "tune-cifar/weekly", parameters)
    assert run["state"] == "COMPLETED", run
    assert stack.mlflow().get_model_version_by_alias(f"{MODEL}-tuned", "champion").version == "1"
    assert psql("optuna", "SELECT count(*) FROM studies") == "1"


def test_deployments_made_from_a_checkout_on_the_host_run_in_the_stack(stack: Stack) -> None:
    """What a user does from a clone: the deployer's folder does not exist in the worker."""
    import numpy as np
    from PIL import Image

    prefect = str(Path(sys.executable).parent / "prefect")
    subprocess.run(
        [prefect, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
        cwd=REPO,
        env={**os.environ, **stack.prefect_env},
        check=True,
        capture_output=True,
        timeout=300,
    )
    s3 = stack.s3()
    for index in range(3):
        png = io.BytesIO()
        Image.fromarray(np.full((32, 32, 3), 60 * index, dtype=np.uint8)).save(png, "PNG")
        s3.pipe(f"cifar/inputs/images/{index}.png", png.getvalue())
    s3.pipe("cifar/inputs/images/broken.png", b"not a png")
    parameters = {
        "input": "s3://cifar/inputs/images",
        "output": "s3://cifar/predictions/host.csv",
        "registered_model_name": MODEL,
    }
    run = run_deployment(stack, "predict-cifar/champion", parameters)
    assert run["state"] == "COMPLETED", run
    rows = s3.cat("cifar/predictions/host.csv").decode().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == [
        f"s3://cifar/inputs/images/{index}.png" for index in range(3)
    ]
    assert "broken.png is not a readable" in s3.cat("cifar/predictions/host.errors.csv").decode()


def _restarts() -> dict[str, str]:
    return {
        service: podman(
            "inspect", "--format", "{{.State.Status}} {{.RestartCount}}", container(service)
        ).stdout.strip()
        for service in SERVICES
    }


@pytest.fixture(scope="module")
def before_bad_input(stack: Stack) -> dict[str, str]:
    """Each service's state and restart count before the first bad-input run."""
    return _restarts()


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"data_url": "s3://cifar/inputs/no-such.tar.gz"}, "no-such.tar.gz"),
        # an insider's paths to the worker's secrets: refused by the worker's run policy
        # (docker/run-policy.toml) before anything is read
        ({"data_url": "file:///proc/self/environ"}, "data_url 'file:///proc/self/environ' is"),
        (
            {"data_url": "file:///run/secrets/s3_data_secret_key"},
            "data_url 'file:///run/secrets/s3_data_secret_key' is not allowed by the run policy",
        ),
        ({"data_url": "http://169.254.169.254/latest/"}, "names a link-local address"),
        (
            {"mlflow_tracking_uri": "http://prefect-server:4200"},
            "mlflow_tracking_uri 'http://prefect-server:4200' is not allowed by the run policy",
        ),
        ({"dask_address": "tcp://elsewhere:8786"}, "dask_address 'tcp://elsewhere:8786' is not"),
        ({"storage_path": "s3://mlflow/poisoned"}, "storage_path 's3://mlflow/poisoned' is not"),
    ],
    ids=["missing-object", "environ", "secret-file", "metadata", "mlflow", "dask", "storage"],
)
def test_bad_input_fails_the_run_with_one_clear_message(
    stack: Stack,
    before_bad_input: dict[str, str],
    archive: dict[str, str],
    parameters: dict[str, Any],
    message: str,
) -> None:
    raw = "cifar/data/raw"
    before = set(stack.s3().ls(raw)) if stack.s3().exists(raw) else set()
    run = _train(stack, archive, **parameters)
    assert run["state"] == "FAILED", run
    assert message in (run["message"] or ""), run
    stack.s3().invalidate_cache()
    assert (set(stack.s3().ls(raw)) if stack.s3().exists(raw) else set()) == before


@pytest.mark.parametrize(
    "job_variables",
    [
        {"env": {"CIFAR_RUN_POLICY": "/dev/null"}},
        {"command": "sh -c 'cat /run/secrets/* > /tmp/leaked'"},
    ],
    ids=["env", "command"],
)
def test_a_run_may_not_set_its_environment_or_command(
    stack: Stack, archive: dict[str, str], job_variables: dict[str, Any]
) -> None:
    """The work pool's template (deployments/work-pool.json) fixes both: Prefect refuses the
    run, so the worker's run policy and command stay the operator's."""
    done = start_run(stack, "train-cifar/manual", archive, job_variables)
    assert done.returncode != 0
    assert "Additional properties are not allowed" in done.stderr, done.stderr[-3000:]
    assert f"'{next(iter(job_variables))}' was unexpected" in done.stderr, done.stderr[-3000:]


def test_no_service_restarted_or_stopped_after_the_failed_runs(
    before_bad_input: dict[str, str],
) -> None:
    assert all(state.startswith("running ") for state in before_bad_input.values())
    assert _restarts() == before_bad_input


def test_no_secret_is_in_any_log(stack: Stack) -> None:
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    logs = "".join(podman("logs", name, check=False).stdout for name in names if PROJECT in name)
    logs += "".join(podman("logs", name, check=False).stderr for name in names if PROJECT in name)
    assert len(logs) > 10_000  # every service has logged
    secret = [n for n in stack.env if n.endswith(("PASSWORD", "_KEY"))]
    assert [name for name in secret if stack.env[name] in logs] == []


def test_a_dump_restored_into_fresh_volumes_brings_the_registry_and_history_back(
    stack: Stack, tmp_path: Path
) -> None:
    history = "SELECT count(*) FROM flow_run WHERE state_type <> 'SCHEDULED'"
    runs = psql("prefect", history)
    versions = psql("mlflow", "SELECT count(*) FROM model_versions")
    for database in DATABASES:  # docs/containers.md, "Backup and restore"
        pg_dump(database, tmp_path / f"{database}.dump")
    stack.compose("down", "-v")  # every volume gone
    stack.compose("up", "-d", "postgres")
    wait_healthy(("postgres",))
    assert psql("prefect", "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == "0"
    for database in DATABASES:
        pg_restore(database, tmp_path / f"{database}.dump")
    up(stack)
    assert psql("prefect", history) == runs
    assert psql("mlflow", "SELECT count(*) FROM model_versions") == versions
    client = stack.mlflow()  # the training account came back with the auth database
    assert client.get_registered_model(MODEL).aliases["champion"] == "1"

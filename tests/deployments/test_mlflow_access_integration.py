"""The pipeline's MLflow accounts on a server with authentication (``mlflow server --app-name
basic-auth``, ``default_permission = NO_PERMISSIONS``), as the compose stack runs it, made by
``deployments.mlflow_access``: the publisher registers and promotes versions but deletes
nothing, and a failed publish withdraws its version instead of deleting it; the users' account
reads and cannot write an artifact, tag a version or move an alias; an account granted nothing
sees nothing; a request without credentials gets 401."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.server import get_app_client
from mlflow.tracking import MlflowClient

from cifar.models import build_model
from mlops.alias_moves import promote
from mlops.evaluation import Evaluation
from mlops.promotion import PromotionRule
from mlops.registry import register_model, withdraw_version
from mlops.tracking import start_run
from mlops.version_tags import WITHDRAWN_TAG
from tests.lossy_proxy import lossy_proxy
from tests.mlflow_rig import mlflow_server

ADMIN, ADMIN_PASSWORD = "admin", "admin0password0for0tests"
TRAINER, TRAINER_PASSWORD = "trainer", "trainer0password0for0tests"
USER, USER_PASSWORD = "someone", "user0password0for0tests"
MODEL = "access-classifier"


def _started(root: Path) -> Iterator[str]:
    config = root / "basic_auth.ini"
    config.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{root}/auth.db\n"
        f"admin_username = {ADMIN}\nadmin_password = {ADMIN_PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_FLASK_SERVER_SECRET_KEY": "x" * 32}
    with mlflow_server(root, "--app-name", "basic-auth", env=env) as url:
        yield url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _started(tmp_path_factory.mktemp("mlflow-auth"))


@pytest.fixture
def empty_server(tmp_path: Path) -> Iterator[str]:
    """A server with nothing made yet: no account, experiment or registered model."""
    yield from _started(tmp_path)


def _as(username: str, password: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)


def _mlflow_access(
    tracking_uri: str, user: str, password: str, users: str = USER, succeeds: bool = True
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_TRACKING_USERNAME": ADMIN,
        "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
        "MLFLOW_TRAINER_USER": user,
        "MLFLOW_TRAINER_PASSWORD": password,
        "MLFLOW_USER": users,
        "MLFLOW_USER_PASSWORD": USER_PASSWORD,
        "CIFAR_REGISTERED_MODELS": MODEL,
    }
    done = subprocess.run(
        [sys.executable, "-m", "deployments.mlflow_access"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode == 0) == succeeds, done.stderr[-3000:]
    assert password not in done.stdout + done.stderr
    assert USER_PASSWORD not in done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def granted(server: str) -> str:
    """The account made twice over (the deploy step runs at every deploy)."""
    for _ in range(2):
        done = _mlflow_access(server, TRAINER, TRAINER_PASSWORD)
    assert f"'{TRAINER}' may edit registered model '{MODEL}'" in done.stdout
    assert f"'{USER}' may read registered model '{MODEL}'" in done.stdout
    return server


LOST = (
    "/users/create",
    "/experiments/create",
    "/registered-models/create",
    "/users/permissions/grant",
)


def test_mlflow_access_done_when_the_reply_to_each_creation_is_lost(
    empty_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's client sends a POST again when its reply is lost (a busy server, a network):
    the first try made the thing, the second finds it there. Seen in CI: the stack's deploy
    step failed with RESOURCE_ALREADY_EXISTS for its account, and printed the password's hash.
    One proxy per creation, chained in front of one server: each loses its first reply."""
    with ExitStack() as stack:
        url, proxies = empty_server, []
        for lost in LOST:
            url, proxy = stack.enter_context(lossy_proxy(url, lost))
            proxies.append(proxy)
        done = _mlflow_access(url, TRAINER, TRAINER_PASSWORD)
    assert [proxy.seen >= 2 for proxy in proxies] == [True] * len(LOST)  # lost, then sent again
    assert "password_hash" not in done.stdout + done.stderr
    _as(TRAINER, TRAINER_PASSWORD, monkeypatch)
    client = MlflowClient(empty_server)
    assert client.get_experiment_by_name("train-cifar") is not None
    assert client.get_registered_model(MODEL).name == MODEL


@pytest.mark.parametrize("path", ["/", "/api/2.0/mlflow/experiments/search?max_results=1"])
def test_mlflow_access_without_credentials_is_401(server: str, path: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{server}{path}", timeout=10)
    assert caught.value.code == 401


def test_mlflow_access_trainer_registers_and_promotes_but_deletes_nothing(
    granted: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _as(TRAINER, TRAINER_PASSWORD, monkeypatch)
    monkeypatch.chdir(tmp_path)
    run_id = start_run(granted, "train-cifar", "access", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    version = register_model(model, run_id, MODEL, granted)
    evaluation = Evaluation(1.0, {}, [[20, 0], [0, 20]], 40, np.ones(40, bool))
    assert promote(MODEL, version, evaluation, PromotionRule(), granted).alias == "champion"
    client = MlflowClient(granted)
    assert client.get_model_version_by_alias(MODEL, "champion").version == version
    for delete in (
        lambda: client.delete_model_version(MODEL, version),
        lambda: client.delete_registered_model(MODEL),
        lambda: client.delete_run(run_id),
    ):
        with pytest.raises(MlflowException) as caught:
            delete()
        assert caught.value.error_code == "PERMISSION_DENIED"
    # a publish that failed: its version is withdrawn (the account may tag it)
    withdraw_version(MODEL, version, granted, "publishing it failed; rolled back")
    kept = client.get_model_version(MODEL, version)
    assert kept.tags[WITHDRAWN_TAG] == "publishing it failed; rolled back"


def test_mlflow_access_wrong_password_is_refused(
    granted: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(TRAINER, "not" + TRAINER_PASSWORD, monkeypatch)
    with pytest.raises(MlflowException, match="401"):
        MlflowClient(granted).search_experiments()


def test_mlflow_access_users_account_reads_and_rewrites_nothing(
    granted: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What people who start runs are given: they read the champion, its run and its files,
    and cannot overwrite a file of it, tag its version withdrawn or move @champion."""
    _as(TRAINER, TRAINER_PASSWORD, monkeypatch)
    monkeypatch.chdir(tmp_path)
    run_id = start_run(granted, "train-cifar", "users-read", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    version = register_model(model, run_id, MODEL, granted)
    publisher = MlflowClient(granted)
    publisher.set_registered_model_alias(MODEL, "champion", version)
    evidence = tmp_path / "evaluation.json"
    evidence.write_text('{"accuracy": 0.9}')
    publisher.log_artifact(run_id, str(evidence))
    _as(USER, USER_PASSWORD, monkeypatch)
    user = MlflowClient(granted)
    assert user.get_model_version_by_alias(MODEL, "champion").version == version
    assert user.get_run(run_id).info.run_id == run_id
    assert "evaluation.json" in [f.path for f in user.list_artifacts(run_id)]
    forged = tmp_path / "forged" / "evaluation.json"
    forged.parent.mkdir()
    forged.write_text('{"accuracy": 1.0}')
    with pytest.raises(requests.HTTPError) as refused:  # the champion's evidence overwritten
        user.log_artifact(run_id, str(forged))  # (MLflow's artifact proxy answers 403)
    assert refused.value.response.status_code == 403
    for rewrite in (
        lambda: user.set_model_version_tag(MODEL, version, WITHDRAWN_TAG, "by a user"),
        lambda: user.set_registered_model_alias(MODEL, "champion", version),
        lambda: user.delete_registered_model_alias(MODEL, "champion"),
        lambda: user.log_metric(run_id, "accuracy", 1.0),
        lambda: user.create_run(user.get_experiment_by_name("train-cifar").experiment_id),
    ):
        with pytest.raises(MlflowException) as caught:
            rewrite()
        assert caught.value.error_code == "PERMISSION_DENIED"
    _as(TRAINER, TRAINER_PASSWORD, monkeypatch)
    kept = publisher.get_model_version(MODEL, version)
    assert WITHDRAWN_TAG not in kept.tags
    assert publisher.get_model_version_by_alias(MODEL, "champion").version == version
    downloaded = publisher.download_artifacts(run_id, "evaluation.json", str(tmp_path / "back"))
    assert Path(downloaded).read_text() == '{"accuracy": 0.9}'


def test_mlflow_access_an_account_granted_nothing_sees_nothing(
    granted: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """default_permission NO_PERMISSIONS: a logged-in account the deploy step did not grant reads no
    experiment and no registered model of the pipeline."""
    _as(ADMIN, ADMIN_PASSWORD, monkeypatch)
    auth = get_app_client("basic-auth", tracking_uri=granted)
    try:
        auth.create_user("stranger", "stranger0password0x")
    except MlflowException as error:
        assert error.error_code == "RESOURCE_ALREADY_EXISTS"
    _as("stranger", "stranger0password0x", monkeypatch)
    stranger = MlflowClient(granted)
    for read in (
        lambda: stranger.get_registered_model(MODEL),
        lambda: stranger.get_experiment_by_name("train-cifar"),
    ):
        with pytest.raises(MlflowException) as caught:
            read()
        assert caught.value.error_code == "PERMISSION_DENIED"


def test_mlflow_access_refuses_the_publisher_as_the_users_account(server: str) -> None:
    done = _mlflow_access(server, TRAINER, TRAINER_PASSWORD, users=TRAINER, succeeds=False)
    assert "the users' account must not be the publisher's" in done.stderr

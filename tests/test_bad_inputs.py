"""Mistakes users make, end to end through ``train-cifar`` and ``predict-cifar``.

Each case runs the command (in this process, against the session's real Prefect server) and
checks what the user sees (one paragraph, a non-zero exit status, no traceback) and that nothing
is left behind: no rank or other child process, no dataset without its manifest, no checkpoint
without its commit marker, no MLflow run still RUNNING, no registered model version.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import s3fs
from distributed import Client
from mlflow.tracking import MlflowClient
from PIL import Image

from cifar.errors import InvalidParameterError
from cifar.format import write_synthetic_archive
from cifar.models import build_model
from cli import commands as cli
from cli import environment, local_run
from cli.options import LOG_FILE_VARIABLE
from flows.run_policy import POLICY_VARIABLE
from mlops.registry import register_model
from mlops.version_tags import CHAMPION
from tests import s3_rig
from tests.conftest import HttpDir
from tests.helpers import WAIT_S, free_port
from tests.s3_rig import SeaweedServer
from trainlib._internal.common.commit_marker import COMMIT_MARKER

ARCHIVE = "bad-inputs-cifar.tar.gz"
MODEL = "bad-inputs-model"


@dataclass(frozen=True)
class Outcome:
    status: int
    stdout: str
    stderr: str


@dataclass
class Workspace:
    """A folder to run the commands in, with its storage path and MLflow store."""

    root: Path
    http: HttpDir
    archive_md5: str

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root}/mlflow.db"

    @property
    def archive_url(self) -> str:
        return f"{self.http.url}/{ARCHIVE}"

    def serve(self, name: str, data: bytes) -> str:
        (self.http.path / name).write_bytes(data)
        return f"{self.http.url}/{name}"


@pytest.fixture(scope="module")
def archive_md5(http_dir: HttpDir) -> str:
    return write_synthetic_archive(str(http_dir.path / ARCHIVE), images_per_batch=100)


@pytest.fixture
def workspace(
    prefect_server: None,
    http_dir: HttpDir,
    archive_md5: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Workspace]:
    """A fresh folder as the working directory, the commands' environment restored after."""
    monkeypatch.chdir(tmp_path)
    for key, value in environment.ENVIRONMENT.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(LOG_FILE_VARIABLE, str(tmp_path / "train-cifar.log"))
    children = _children()
    yield Workspace(tmp_path, http_dir, archive_md5)
    _assert_nothing_left(tmp_path, children)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _assert_nothing_left(root: Path, children_before: set[int]) -> None:
    left = [
        f"{p.pid} {_cmdline(p)}"
        for p in psutil.Process().children(recursive=True)
        if p.pid not in children_before
        and _alive(p)
        and not _spare_of_session_cluster(p)
        and not _backend_of_session_database(p, children_before)
    ]
    assert left == [], f"processes left behind: {left}"
    datasets = root / "store" / "datasets"
    if datasets.exists():
        half_written = [d.name for d in datasets.iterdir() if not (d / "manifest.json").exists()]
        assert half_written == [], f"datasets without a manifest: {half_written}"
    for checkpoint in (root / "store" / "runs").glob("*/checkpoint_*"):
        assert (checkpoint / COMMIT_MARKER).exists(), f"uncommitted checkpoint {checkpoint}"
    if (root / "mlflow.db").exists():
        client = MlflowClient(f"sqlite:///{root}/mlflow.db")
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments)
        running = [r.info.run_id for r in runs if r.info.status == "RUNNING"]
        assert running == [], f"MLflow runs left RUNNING: {running}"


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return "?"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _backend_of_session_database(process: psutil.Process, children_before: set[int]) -> bool:
    """A connection's backend of the session's PostgreSQL server (forked by its postmaster,
    which ran before the test, when the session's Prefect server opens a connection)."""
    try:
        parent = process.parent()
        return parent is not None and parent.pid in children_before and _name(parent) == "postgres"
    except psutil.Error:
        return False


def _spare_of_session_cluster(process: psutil.Process) -> bool:
    """The idle rank process a worker of the session's shared cluster keeps (its rank pool)."""
    return _name(process) == "trainlib-spare"


def train_cifar(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return Outcome(status, captured.out, captured.err)


def predict_cifar(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    status = cli.predict_main(list(args))
    captured = capsys.readouterr()
    return Outcome(status, captured.out, captured.err)


def _workspace_args(workspace: Workspace) -> list[str]:
    """The options train-cifar and tune-cifar take alike: data, storage, MLflow, model name."""
    return [
        "--data-url",
        workspace.archive_url,
        "--storage-path",
        str(workspace.store),
        "--mlflow-tracking-uri",
        workspace.tracking_uri,
        "--registered-model-name",
        MODEL,
    ]


def _train_args(workspace: Workspace, *extra: str) -> list[str]:
    return [
        *_workspace_args(workspace),
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--rows-per-file",
        "250",
        *extra,
    ]


def _assert_failed(outcome: Outcome, *phrases: str) -> str:
    """The command failed with one paragraph containing ``phrases``, and no traceback."""
    assert outcome.status == local_run.EXIT_FAILED, outcome
    paragraph = outcome.stderr.strip().split("\n\n")[-1]
    for phrase in phrases:
        assert phrase in paragraph, paragraph
    assert "Full details:" in paragraph and "\n" not in paragraph
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.stdout == ""
    return paragraph


def _registered_versions(workspace: Workspace) -> list[str]:
    if not (workspace.root / "mlflow.db").exists():
        return []
    client = MlflowClient(workspace.tracking_uri)
    return [str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")]


def _no_archive_kept(workspace: Workspace) -> None:
    raw = workspace.store / "raw"
    assert not raw.exists() or list(raw.iterdir()) == []


def test_wrong_md5(workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = train_cifar(capsys, *_train_args(workspace, "--data-md5", "0" * 32))
    _assert_failed(outcome, f"has md5 {workspace.archive_md5}, expected {'0' * 32}", "data_md5")
    _no_archive_kept(workspace)
    assert _registered_versions(workspace) == []


def test_truncated_archive(workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    data = (workspace.http.path / ARCHIVE).read_bytes()
    url = workspace.serve("truncated.tar.gz", data[: len(data) // 2])
    outcome = train_cifar(capsys, *_train_args(workspace, "--data-url", url))
    _assert_failed(outcome, "truncated")
    assert not (workspace.store / "datasets").exists()
    assert _registered_versions(workspace) == []


def test_tarball_that_is_not_cifar(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("photos/readme.txt")
        member.size = 5
        tar.addfile(member, io.BytesIO(b"hello"))
    url = workspace.serve("photos.tar.gz", buffer.getvalue())
    outcome = train_cifar(capsys, *_train_args(workspace, "--data-url", url))
    _assert_failed(outcome, "not a CIFAR-10")
    assert not (workspace.store / "datasets").exists()
    assert _registered_versions(workspace) == []


def test_unreachable_host(workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/cifar-10-python.tar.gz"  # nothing listens there
    outcome = train_cifar(capsys, *_train_args(workspace, "--data-url", url))
    _assert_failed(
        outcome, "Cannot reach 127.0.0.1 (connection refused) after 3 tries", "make run-offline"
    )
    _no_archive_kept(workspace)


def test_http_404(workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{workspace.http.url}/no-such-archive.tar.gz"
    outcome = train_cifar(capsys, *_train_args(workspace, "--data-url", url))
    _assert_failed(outcome, f"Cannot download {url}: HTTP 404", "Check data_url")
    _no_archive_kept(workspace)


def test_unknown_model_name(workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:  # the option's choices: refused before anything
        train_cifar(capsys, *_train_args(workspace, "--model", "resnet-18"))
    assert exit.value.code == 2
    assert "invalid choice: 'resnet-18' (choose from 'small_cnn', 'resnet18')" in (
        capsys.readouterr().err
    )
    assert not workspace.store.exists()


def test_unknown_model_name_as_a_flow_parameter(workspace: Workspace) -> None:
    from flows.train_cifar import train_cifar as flow

    with pytest.raises(InvalidParameterError, match="Unknown model 'resnet-18'; choose one of"):
        flow(
            data_url=workspace.archive_url,
            storage_path=str(workspace.store),
            model="resnet-18",
            mlflow_tracking_uri=workspace.tracking_uri,
        )
    assert not workspace.store.exists()  # refused before anything was downloaded


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"promote_alpha": 1.5}, "promote_alpha=1.5 must be between 0 and 1"),
        ({"promote_margin": 5.0}, "promote_margin=5 must be at least 0 and below 1"),
        ({"promote_margin": -0.01}, "promote_margin=-0.01 must be at least 0 and below 1"),
        ({"max_class_drop": -0.1}, "max_class_drop=-0.1 must be between 0 and 1"),
    ],
)
def test_a_promotion_parameter_that_cannot_work_is_refused_before_the_download(
    workspace: Workspace, parameters: dict[str, float], named: str
) -> None:
    from flows.train_cifar import train_cifar as flow

    with pytest.raises(InvalidParameterError, match=re.escape(named)):
        flow(
            data_url=workspace.archive_url,
            storage_path=str(workspace.store),
            mlflow_tracking_uri=workspace.tracking_uri,
            **parameters,
        )
    assert not workspace.store.exists()  # nothing downloaded, nothing trained


def test_promote_alpha_out_of_range_on_the_command_line(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = train_cifar(capsys, *_train_args(workspace, "--promote-alpha", "1.5"))
    _assert_failed(outcome, "promote_alpha=1.5 must be between 0 and 1")
    assert not workspace.store.exists()


@pytest.mark.parametrize(
    ("cluster_class", "cluster_kwargs", "refused"),
    [
        ("subprocess.Popen", {"args": ["touch", "pwned"]}, "'subprocess.Popen' is not allowed"),
        ("distributed.LocalCluster", {"preload": ["pwned"]}, "may not set 'preload'"),
        (
            "distributed.LocalCluster",
            {"n_workers": 1, "config": {"distributed.worker.preload": ["pwned.py"]}},
            "may not set 'config'",
        ),
        (
            "distributed.LocalCluster",
            {"env": {"DASK_DISTRIBUTED__WORKER__PRELOAD": "pwned.py"}},
            "may not set 'env'",
        ),
    ],
    ids=["class", "preload", "config", "env"],
)
def test_code_named_by_a_parameter_is_refused(
    workspace: Workspace,
    capsys: pytest.CaptureFixture[str],
    cluster_class: str,
    cluster_kwargs: dict[str, object],
    refused: str,
) -> None:
    """Whoever may start a run may not run code as the worker: the operator's allowlist."""
    outcome = train_cifar(
        capsys,
        *_train_args(workspace, "--dask-cluster-class", cluster_class),
        "--dask-cluster-kwargs",
        json.dumps(cluster_kwargs),
    )
    _assert_failed(outcome, refused, "dask_cluster_classes" if "class" in refused else "")
    assert not workspace.store.exists()  # refused before anything was downloaded
    assert not (workspace.root / "pwned").exists()


@pytest.fixture
def worker_policy(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run policy of a worker that serves others: reads from the test's HTTP server and
    images, writes to the workspace's store and predictions, its own MLflow."""
    file = workspace.root / "run-policy.toml"
    file.write_text(
        f'read = ["{workspace.http.url}/", "{workspace.root}/images"]\n'
        f'write = ["{workspace.store}", "{workspace.root}/scored"]\n'
        f'registered_models = ["{MODEL}"]\n'
    )
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", workspace.tracking_uri)
    return file


@pytest.mark.parametrize(
    ("parameter", "value"),
    [
        ("data_url", "file:///proc/self/environ"),
        ("data_url", "http://169.254.169.254/latest/meta-data/iam/security-credentials/"),
        ("storage_path", "{root}/elsewhere"),
    ],
    ids=["environment", "cloud-metadata", "storage-elsewhere"],
)
def test_a_place_outside_the_workers_run_policy_is_refused_before_anything_is_read(
    workspace: Workspace,
    worker_policy: Path,
    capsys: pytest.CaptureFixture[str],
    parameter: str,
    value: str,
) -> None:
    value = value.format(root=workspace.root)
    option = "--" + parameter.replace("_", "-")
    outcome = train_cifar(capsys, *_train_args(workspace, option, value))
    _assert_failed(outcome, f"{parameter} {value!r}", "allow")
    assert not workspace.store.exists() and not (workspace.root / "elsewhere").exists()


@dataclass
class Listener:
    """A TCP server on loopback that records every connection and byte it receives."""

    url: str
    received: list[bytes]


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                connection.settimeout(5)
                received.append(connection.recv(65536))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield Listener(f"127.0.0.1:{server.getsockname()[1]}", received)
    finally:
        server.close()
        thread.join(timeout=10)


def test_mlflow_or_the_study_pointed_at_a_listener_receives_no_credential(
    workspace: Workspace,
    worker_policy: Path,
    listener: Listener,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "trainer")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-to-be-sent-42")
    monkeypatch.setenv("PGPASSWORD", "not-to-be-sent-43")
    uri = f"http://{listener.url}"
    outcome = train_cifar(capsys, *_train_args(workspace, "--mlflow-tracking-uri", uri))
    _assert_failed(outcome, f"mlflow_tracking_uri {uri!r} is not allowed by the run policy")
    study = f"postgresql://optuna@{listener.url}/optuna"
    outcome = Outcome(
        cli.tune_main([*_workspace_args(workspace), "--study-storage", study]),
        *capsys.readouterr(),
    )
    _assert_failed(outcome, f"study_storage {study!r} is not allowed by the run policy")
    assert listener.received == []
    assert not workspace.store.exists()


def test_predictions_outside_the_allowed_output_root_are_refused(
    workspace: Workspace,
    worker_policy: Path,
    capsys: pytest.CaptureFixture[str],
    champion: str,
) -> None:
    images = _images(workspace.root / "images", 2)
    output = workspace.root / "elsewhere.csv"
    outcome = predict_cifar(
        capsys, str(images), "--output", str(output), "--registered-model-name", MODEL
    )
    _assert_failed(outcome, f"output {str(output)!r} is not allowed by the run policy", "`write`")
    assert not output.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--registered-model-name", "someone-elses"), ("--alias", "latest")],
)
def test_predict_loads_only_the_models_and_aliases_the_workers_policy_lists(
    workspace: Workspace,
    worker_policy: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
) -> None:
    """A model anyone may register (its pickle could run code) is never loaded by a worker."""
    images = _images(workspace.root / "images", 2)
    output = workspace.root / "scored" / "out.csv"
    outcome = predict_cifar(
        capsys,
        str(images),
        "--output",
        str(output),
        "--registered-model-name",
        MODEL,
        option,
        value,
    )
    parameter = option.removeprefix("--").replace("-", "_")
    _assert_failed(outcome, f"{parameter} {value!r} is not allowed by the run policy", "add")
    assert not output.exists()


def test_more_workers_than_the_cluster_has(
    workspace: Workspace, capsys: pytest.CaptureFixture[str], dask_client: Client
) -> None:
    workers = len(dask_client.scheduler_info()["workers"])
    outcome = train_cifar(
        capsys,
        *_train_args(
            workspace,
            "--dask-address",
            dask_client.scheduler.address,
            "--num-workers",
            str(workers + 1),
            "--dask-worker-timeout-s",
            "2",
        ),
    )
    _assert_failed(
        outcome,
        f"needs {workers + 1} Dask workers",
        f"has {workers} after 2 s",
        "lower num_workers",
    )
    assert not (workspace.store / "datasets").exists()
    assert len(dask_client.scheduler_info()["workers"]) == workers  # the user's cluster is intact


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody may write in, root included (the immutable attribute where root)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield folder
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_storage_path_not_writable(
    workspace: Workspace, capsys: pytest.CaptureFixture[str], read_only_folder: Path
) -> None:
    store = read_only_folder / "store"
    outcome = train_cifar(capsys, *_train_args(workspace, "--storage-path", str(store)))
    _assert_failed(outcome, f"Cannot write under storage_path {store}", "a folder you can write")
    assert list(read_only_folder.iterdir()) == []


def test_s3_storage_with_wrong_credentials(
    workspace: Workspace,
    capsys: pytest.CaptureFixture[str],
    checked_s3: SeaweedServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong_secret = "not-the-secret-42"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_rig.KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", checked_s3.endpoint)
    # fsspec reuses a filesystem made with the same arguments: one made earlier in this process
    # carries the credentials and endpoint the environment had then (a new process has none);
    # the one made here, with the wrong secret, is not left to a later test.
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        outcome = train_cifar(
            capsys, *_train_args(workspace, "--storage-path", f"s3://{s3_rig.BUCKET}/cifar")
        )
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    _assert_failed(
        outcome, f"Cannot write under storage_path s3://{s3_rig.BUCKET}/cifar", "credentials"
    )
    assert wrong_secret not in outcome.stderr
    assert wrong_secret not in (workspace.root / "train-cifar.log").read_text()
    fs = s3fs.S3FileSystem(
        key=s3_rig.KEY,
        secret=s3_rig.SECRET,
        client_kwargs={"endpoint_url": checked_s3.endpoint},
    )
    assert fs.find(f"{s3_rig.BUCKET}/cifar") == []


def test_learning_rate_so_large_the_loss_is_nan(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = train_cifar(capsys, *_train_args(workspace, "--lr", "1e12"))
    paragraph = _assert_failed(outcome, "The training loss became", "nothing was registered")
    assert re.search(r"at epoch 1, (step \d+|steps \d+-\d+) ", paragraph), paragraph
    assert "Lower the learning rate" in paragraph
    assert _registered_versions(workspace) == []
    client = MlflowClient(workspace.tracking_uri)
    experiment = client.get_experiment_by_name("train-cifar")
    assert experiment is not None
    assert [r.info.status for r in client.search_runs([experiment.experiment_id])] == ["FAILED"]
    assert list((workspace.store / "runs").glob("*/checkpoint_*")) == []


@pytest.fixture
def champion(workspace: Workspace) -> str:
    """A registered model version at @champion (untrained: these tests only need one)."""
    client = MlflowClient(workspace.tracking_uri)
    experiment_id = client.create_experiment("bad-inputs")
    run = client.create_run(experiment_id)
    model = build_model("small_cnn", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    version = register_model(model, run.info.run_id, MODEL, workspace.tracking_uri)
    client.set_terminated(run.info.run_id)
    client.set_registered_model_alias(MODEL, CHAMPION, version)
    return version


def _images(folder: Path, count: int) -> Path:
    folder.mkdir()
    for i in range(count):
        pixels = np.random.default_rng(i).integers(0, 256, (32, 32, 3), np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i}.png")
    return folder


@pytest.mark.parametrize(
    ("model", "alias"), [("no-such-model", CHAMPION), (MODEL, "no-such-alias")]
)
def test_predict_with_a_model_or_alias_that_does_not_exist(
    workspace: Workspace,
    capsys: pytest.CaptureFixture[str],
    champion: str,
    model: str,
    alias: str,
) -> None:
    images = _images(workspace.root / "images", 2)
    output = workspace.root / "scored.csv"
    outcome = predict_cifar(
        capsys,
        str(images),
        "--output",
        str(output),
        "--registered-model-name",
        model,
        "--alias",
        alias,
        "--mlflow-tracking-uri",
        workspace.tracking_uri,
    )
    _assert_failed(outcome, f"Model {model!r} has no version with alias @{alias}", "train one")
    assert not output.exists()


def test_predict_corrupt_image_goes_to_the_errors_file(
    workspace: Workspace, capsys: pytest.CaptureFixture[str], champion: str
) -> None:
    images = _images(workspace.root / "images", 3)
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    output = workspace.root / "scored.csv"
    outcome = predict_cifar(
        capsys,
        str(images),
        "--output",
        str(output),
        "--registered-model-name",
        MODEL,
        "--mlflow-tracking-uri",
        workspace.tracking_uri,
    )
    assert outcome.status == 0, outcome.stderr
    summary = json.loads(outcome.stdout)
    assert (summary["num_scored"], summary["num_errors"]) == (3, 1)
    assert sorted(Path(f).name for f in pd.read_csv(output)["file"]) == [
        "img0.png",
        "img1.png",
        "img2.png",
    ]
    errors = pd.read_csv(summary["errors_uri"])
    assert [Path(f).name for f in errors["file"]] == ["broken.png"]
    assert errors["error"].tolist() == [
        "broken.png is not a readable PNG or JPEG image (OSError: Truncated File Read)"
    ]


def test_ctrl_c_ends_train_cifar_within_10_s(workspace: Workspace) -> None:
    """SIGINT while the ranks train: exit status 130 within 10 s, one line, no rank left. As
    `make run-offline` runs: Prefect's temporary server on a new PREFECT_HOME (it stops too)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(workspace.root / "prefect-home")
    args = ["-m", "cli.commands", *_train_args(workspace, "--epochs", "50")]
    _assert_ctrl_c_ends(args, env)


def test_ctrl_c_ends_tune_cifar_within_10_s(workspace: Workspace, prefect_server: None) -> None:
    """The same for a search: its running trial's ranks stop, nothing is left."""
    tune = "import sys; from cli.commands import tune_main; sys.exit(tune_main())"
    search_space = json.dumps({"lr": ["choice", [0.05]], "batch_size": ["choice", [64]]})
    _assert_ctrl_c_ends(
        [
            "-c",
            tune,
            *_workspace_args(workspace),
            "--search-space",
            search_space,
            "--num-samples",
            "2",
            "--max-concurrent-trials",
            "1",
            "--epochs",
            "50",
        ]
    )


def _assert_ctrl_c_ends(python_args: list[str], env: dict[str, str] | None = None) -> None:
    """Run Python with ``python_args`` (a CLI), SIGINT it once a rank trains: exit status 130
    within 10 s, one line and no traceback, none of its processes left. ``env`` defaults to
    this one's, with the session's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    if env is None:
        env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    process = subprocess.Popen(
        [sys.executable, *python_args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 3 * WAIT_S
        while not any(_name(p) == "trainlib-rank" for p in _descendants(process.pid)):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no rank started"
            time.sleep(0.1)
        started = _descendants(process.pid)  # ranks, spare processes, whatever else it runs
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        elapsed = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == local_run.EXIT_INTERRUPTED, stderr
    assert elapsed <= 10.0
    assert "Interrupted (Ctrl-C)" in stderr and "Traceback" not in stderr
    assert [p.pid for p in started if _alive(p)] == []


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def _name(process: psutil.Process) -> str:
    try:
        return str(process.name())
    except psutil.NoSuchProcess:
        return ""

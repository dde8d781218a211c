"""The train-cifar and predict-cifar flows end to end: real Prefect, MLflow, Dask and gloo."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import pytest
from distributed import Client
from mlflow.tracking import MlflowClient
from PIL import Image
from prefect.states import State

from cifar.dataset import read_manifest
from cifar.errors import UnsafeArchiveError
from cifar.format import CLASS_NAMES, write_synthetic_archive
from flows.predict_cifar import predict_cifar
from flows.time_limit import TimeLimitExceeded
from flows.train_cifar import train_cifar
from tasks.predict import read_inputs
from tests.conftest import HttpDir
from tests.helpers import free_port, working_ranks
from tests.prefect_records import task_run_states

MODEL = "e2e-classifier"
EPOCHS = 3


@dataclass(frozen=True)
class Workspace:
    root: Path
    tracking_uri: str
    archive_url: str
    archive_md5: str
    images: Path
    http: HttpDir

    def run(self, **overrides: Any) -> Any:
        params: dict[str, Any] = {
            "data_url": self.archive_url,
            "data_md5": self.archive_md5,
            "storage_path": str(self.root / "store"),
            "epochs": EPOCHS,
            "batch_size": 64,
            "lr": 0.05,
            "seed": 7,
            "num_workers": 2,
            "rows_per_file": 250,
            "mlflow_tracking_uri": self.tracking_uri,
            "registered_model_name": MODEL,
        }
        return train_cifar(**{**params, **overrides})

    def versions(self) -> list[str]:
        return sorted(
            str(v.version)
            for v in MlflowClient(self.tracking_uri).search_model_versions(f"name='{MODEL}'")
        )


@pytest.fixture(scope="module")
def workspace(
    prefect_server: None, http_dir: HttpDir, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("flow")
    md5 = write_synthetic_archive(
        str(http_dir.path / "cifar-10-python.tar.gz"), images_per_batch=200
    )
    images = root / "to-score"
    images.mkdir()
    for i in range(5):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (32, 32, 3), np.uint8)).save(
            images / f"img{i}.png"
        )
    old_cwd = os.getcwd()
    os.chdir(root)  # MLflow's sqlite store keeps artifacts in ./mlruns
    patch = pytest.MonkeyPatch()
    patch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")  # a sample a second, not 10 s
    try:
        yield Workspace(
            root,
            f"sqlite:///{root}/mlflow.db",
            f"{http_dir.url}/cifar-10-python.tar.gz",
            md5,
            images,
            http_dir,
        )
    finally:
        patch.undo()
        os.chdir(old_cwd)


@pytest.fixture(scope="module")
def first_run(workspace: Workspace) -> dict[str, Any]:
    return workspace.run(predict_input=str(workspace.images))


@pytest.fixture(scope="module")
def second_run(first_run: dict[str, Any], workspace: Workspace) -> State[Any]:
    """The same data and options again with another seed: nothing to prepare, and a model that
    differs from the first only by chance."""
    state: State[Any] = workspace.run(seed=8, return_state=True)
    return state


def test_flow_registers_first_model_as_champion(
    first_run: dict[str, Any], workspace: Workspace
) -> None:
    assert (first_run["model_version"], first_run["promoted"], first_run["alias"]) == (
        "1",
        True,
        "champion",
    )
    champion = MlflowClient(workspace.tracking_uri).get_model_version_by_alias(MODEL, "champion")
    assert str(champion.version) == "1" and champion.run_id == first_run["mlflow_run_id"]


def test_flow_tracks_one_run_with_per_epoch_metrics(
    first_run: dict[str, Any], workspace: Workspace
) -> None:
    client = MlflowClient(workspace.tracking_uri)
    experiment = client.get_experiment_by_name("train-cifar")
    assert experiment is not None
    runs = [  # the training runs: each evaluation is a run nested under its training run
        r
        for r in client.search_runs([experiment.experiment_id])
        if "mlflow.parentRunId" not in r.data.tags
    ]
    assert [r.info.run_id for r in runs] == [first_run["mlflow_run_id"]]
    history = client.get_metric_history(first_run["mlflow_run_id"], "val_accuracy")
    assert [m.step for m in history] == list(range(EPOCHS))
    run = runs[0]
    assert run.data.params["model"] == "small_cnn" and run.data.tags["world_size"] == "2"
    assert run.data.params["seed"] == "7"  # the flow's seed reached the training
    assert run.info.status == "FINISHED"


def test_flow_model_is_well_above_chance(first_run: dict[str, Any]) -> None:
    assert first_run["test_accuracy"] > 0.5  # chance is 0.1


def test_flow_predicts_every_input_image(first_run: dict[str, Any]) -> None:
    table = pd.read_csv(first_run["predictions"])
    assert sorted(Path(f).name for f in table["file"]) == [f"img{i}.png" for i in range(5)]
    assert set(table["model_version"].astype(str)) == {"1"}


def test_flow_run_logs_its_datasets_and_digest(
    first_run: dict[str, Any], workspace: Workspace
) -> None:
    client = MlflowClient(workspace.tracking_uri)
    (dataset_dir,) = (workspace.root / "store" / "datasets").iterdir()
    manifest = read_manifest(str(dataset_dir))
    assert manifest is not None and manifest.synthetic
    version = client.get_model_version(MODEL, first_run["model_version"])
    inputs = client.get_run(first_run["mlflow_run_id"]).inputs.dataset_inputs
    evaluated = client.get_run(version.tags["evaluation_run"])  # the evaluation's own run
    assert evaluated.data.tags["mlflow.parentRunId"] == first_run["mlflow_run_id"]
    inputs += evaluated.inputs.dataset_inputs
    logged = {d.dataset.name.rsplit("/", 1)[-1]: d.dataset for d in inputs}
    assert sorted(logged) == ["test", "train", "val"]  # the training run: train and val only
    for split, dataset in logged.items():
        assert dataset.digest == manifest.digest(split)
        assert json.loads(dataset.source)["url"] == workspace.archive_url
    assert {t.value for d in inputs for t in d.tags} == {"training", "validation", "test"}
    assert version.tags["data_digest"] == manifest.digest()
    assert version.tags["synthetic_data"] == "true"


def test_flow_run_logs_system_metrics(first_run: dict[str, Any], workspace: Workspace) -> None:
    client = MlflowClient(workspace.tracking_uri)
    cpu = [
        m.value
        for m in client.get_metric_history(
            first_run["mlflow_run_id"], "system/cpu_utilization_percentage"
        )
    ]
    assert all(0.0 <= value <= 100.0 for value in cpu), cpu
    assert max(cpu) >= 50.0, cpu  # 2 ranks training on this machine's cores: it was busy
    metrics = client.get_run(first_run["mlflow_run_id"]).data.metrics
    used_mb = metrics["system/system_memory_usage_megabytes"]
    total_mb = psutil.virtual_memory().total / 1e6
    assert 0.0 < used_mb <= total_mb
    assert metrics["system/system_memory_usage_percentage"] == pytest.approx(
        used_mb / total_mb * 100,
        abs=0.05 + 1e-6,  # MLflow rounds it to 0.1
    )
    # The host where the ranks ran (the LocalCluster's, 127.0.0.1), sampled through Dask.
    host_cpu = client.get_metric_history(
        first_run["mlflow_run_id"], "system/127.0.0.1/cpu_utilization_percentage"
    )
    assert host_cpu and all(0.0 <= m.value <= 100.0 for m in host_cpu), host_cpu
    assert 0.0 < metrics["system/127.0.0.1/system_memory_usage_megabytes"] <= total_mb


def test_flow_second_run_reuses_download_and_preprocess(
    second_run: State[Any], workspace: Workspace
) -> None:
    states = task_run_states(
        second_run.state_details.flow_run_id, ["download", "preprocess", "train"]
    )
    assert (states["download"], states["preprocess"]) == ("Cached", "Cached")
    assert states["train"] == "Completed"


def test_flow_another_seed_is_not_promoted_and_says_why_in_numbers(
    first_run: dict[str, Any], second_run: State[Any], workspace: Workspace
) -> None:
    second = second_run.result()
    assert (second["promoted"], second["alias"]) == (False, "challenger")
    client = MlflowClient(workspace.tracking_uri)
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"
    version = client.get_model_version(MODEL, second["model_version"])
    reason = version.tags["promotion"]
    figures = (
        f"@challenger: test accuracy {second['test_accuracy']:.4f} against the champion's "
        f"{first_run['test_accuracy']:.4f} on the same 200 images: "
    )
    assert reason.startswith(figures), reason
    assert "the gain is at least " in reason and "one-sided 98.15% score limits" in reason
    assert "comparison 1 on test split 1 of this model, alpha 0.01848 (its share " in reason
    assert "champion version 1 stays" in reason and (": not shown" in reason or ": worse" in reason)
    assert client.get_run(second["mlflow_run_id"]).data.params["seed"] == "8"
    card = version.description  # the model card, in the MLflow UI
    assert f"Not promoted: {reason.removeprefix('@challenger: ')}." in card
    assert "| seed | 8 |" in card and "## Release gates" in card


def _mislabelled(archive: bytes, wrong: int, instead: int) -> bytes:
    """The archive with every training image of class ``wrong`` labelled ``instead`` (the
    test batch as it was): a model that never predicts ``wrong``."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive)) as source,
        tarfile.open(fileobj=out, mode="w:gz") as target,
    ):
        for member in source.getmembers():
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            if "data_batch" in member.name:
                batch = pickle.loads(data, encoding="latin1")
                batch["labels"] = [instead if y == wrong else y for y in batch["labels"]]
                data = pickle.dumps(batch, protocol=2)
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    return out.getvalue()


def test_flow_a_model_that_misses_a_class_fails_the_class_gate(
    second_run: State[Any], workspace: Workspace
) -> None:
    original = (workspace.http.path / "cifar-10-python.tar.gz").read_bytes()
    broken = _mislabelled(original, wrong=0, instead=1)
    url = _serve(workspace, "broken.tar.gz", broken)
    result = workspace.run(data_url=url, data_md5=hashlib.md5(broken).hexdigest())
    assert (result["promoted"], result["alias"]) == (False, "challenger")
    client = MlflowClient(workspace.tracking_uri)
    tags = client.get_model_version(MODEL, result["model_version"]).tags
    assert tags["gate/class_drop"].startswith(
        "failed: classes not shown to lose at most 0.04 (max_class_drop) against the champion: "
        "airplane ("
    ), tags["gate/class_drop"]
    assert "failed the release gate class_drop" in tags["promotion"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"


def _serve(workspace: Workspace, name: str, data: bytes) -> str:
    (workspace.http.path / name).write_bytes(data)
    return f"{workspace.http.url}/{name}"


def test_flow_path_traversal_archive_registers_nothing(
    first_run: dict[str, Any], workspace: Workspace
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("../../../tmp/evil.txt")
        member.size = 4
        tar.addfile(member, io.BytesIO(b"evil"))
    url = _serve(workspace, "evil.tar.gz", buffer.getvalue())
    before = workspace.versions()
    with pytest.raises(UnsafeArchiveError, match="escapes the target directory"):
        workspace.run(data_url=url, data_md5=None, storage_path=str(workspace.root / "store-evil"))
    assert workspace.versions() == before


def test_served_champion_answers_as_predict_cifar(
    first_run: dict[str, Any], workspace: Workspace, tmp_path: Path
) -> None:
    """``mlflow models serve`` of models:/NAME@champion answers raw uint8 images over HTTP with
    the scores whose softmax predict-cifar wrote for the same images."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{MODEL}@champion"]
    command += ["--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": workspace.tracking_uri}
    # It execs `uvicorn` from PATH: the virtual environment's bin, as after `activate`.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_serving(f"http://127.0.0.1:{port}/ping", server, log)
        inputs = read_inputs(str(workspace.images))
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps({"inputs": inputs.images.tolist()}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            scores = np.asarray(json.loads(response.read())["predictions"], dtype=np.float64)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert scores.shape == (5, 10)
    served = np.exp(scores - scores.max(1, keepdims=True))
    served /= served.sum(1, keepdims=True)
    table = pd.read_csv(first_run["predictions"]).set_index("file").loc[inputs.names]
    expected = table[[f"prob_{name}" for name in CLASS_NAMES]].to_numpy()
    np.testing.assert_allclose(served, expected, atol=1e-5)
    assert list(served.argmax(1)) == list(table["predicted_label"])


def _wait_until_serving(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert server.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)  # polling the server's health endpoint until it answers


def test_predict_flow_scores_with_champion(first_run: dict[str, Any], workspace: Workspace) -> None:
    output = str(workspace.root / "scored.parquet")
    summary = predict_cifar(
        str(workspace.images),
        output,
        registered_model_name=MODEL,
        mlflow_tracking_uri=workspace.tracking_uri,
    )
    assert (summary["num_scored"], summary["num_errors"], summary["model_version"]) == (5, 0, "1")
    assert len(pd.read_parquet(output)) == 5


def test_flow_that_would_change_nothing_ends_early_and_new_data_trains(
    second_run: State[Any], workspace: Workspace
) -> None:
    """The champion's data, commit and options again: not trained, saying why, nothing
    registered; another archive at the same URL, with the same options, trains."""
    before = workspace.versions()
    state: State[Any] = workspace.run(return_state=True)  # the first run's options
    skipped = state.result()
    assert skipped["skipped"] is True
    assert skipped["reason"].startswith("Nothing would change: champion version 1 of")
    assert workspace.versions() == before
    states = task_run_states(
        state.state_details.flow_run_id, ["download", "preprocess", "check-unchanged"]
    )
    assert "train" not in states
    archive = workspace.http.path / "cifar-10-python.tar.gz"
    original = archive.read_bytes()
    try:  # new data at the same URL: another archive, another digest
        md5 = write_synthetic_archive(str(archive), images_per_batch=200, seed=1)
        trained = workspace.run(data_md5=md5)
    finally:
        archive.write_bytes(original)
    assert "skipped" not in trained
    assert workspace.versions() == [*before, trained["model_version"]]


def test_flow_over_its_time_limit_fails_naming_it_with_its_ranks_gone(
    workspace: Workspace, dask_client: Client
) -> None:
    """A run that outlasts ``timeout_minutes`` (30 s here, mid-training) fails soon after,
    saying which limit stopped it, with every rank stopped and nothing registered."""
    before = workspace.versions()
    started = time.monotonic()
    state: State[Any] = workspace.run(
        dask_address=dask_client.scheduler.address,
        epochs=100_000,
        timeout_minutes=0.5,
        run_name="over-its-time",
        return_state=True,
    )
    took = time.monotonic() - started
    assert state.is_failed(), state
    with pytest.raises(TimeLimitExceeded, match=r"timeout_minutes=0\.5, and was stopped"):
        state.result()
    assert 30 <= took < 30 + 20
    assert task_run_states(state.state_details.flow_run_id, ["train"])["train"] != "Completed"
    deadline = time.monotonic() + 10
    while (ranks := working_ranks(dask_client)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the process table for the ranks' exit, bounded
    assert ranks == []
    assert workspace.versions() == before

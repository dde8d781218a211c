"""Prefect's cache of the data steps on a real Prefect server: reused when the files are
intact, recomputed when they are not, skipped (with a warning) when it cannot be written."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.states import State

from cifar.format import write_synthetic_archive
from tasks.download import fetch_archive
from tasks.layout import StorageLayout
from tasks.preprocess import prepare_dataset
from tests.prefect_records import task_run_states
from trainlib import DaskConfig


@flow(name="data-steps", persist_result=True)  # as the pipeline's flows: see flows/__init__.py
def data_steps(url: str, md5: str, storage_path: str, scheduler: str) -> str:
    layout = StorageLayout.at(storage_path)
    archive = fetch_archive(url, layout, md5)
    dask_config = DaskConfig(address=scheduler)
    dataset = prepare_dataset(
        archive, layout, dask_config=dask_config, num_workers=2, batch_size=16, rows_per_file=100
    )
    return dataset.uri


def _states(url: str, md5: str, root: Path, scheduler: str) -> tuple[dict[str, str], str]:
    state: State[Any] = data_steps(url, md5, str(root / "store"), scheduler, return_state=True)
    states = task_run_states(state.state_details.flow_run_id, ["download", "preprocess"])
    return states, state.result()


@pytest.fixture
def archive(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "cifar-10-python.tar.gz"
    return path.as_uri(), write_synthetic_archive(str(path), images_per_batch=40)


def test_caching_reuses_intact_results_and_recomputes_damaged_ones(
    prefect_server: None, dask_client: Any, archive: tuple[str, str], tmp_path: Path
) -> None:
    url, md5 = archive
    scheduler = dask_client.scheduler.address
    first, dataset_uri = _states(url, md5, tmp_path, scheduler)
    assert (first["download"], first["preprocess"]) == ("Completed", "Completed")
    again, _ = _states(url, md5, tmp_path, scheduler)
    assert (again["download"], again["preprocess"]) == ("Cached", "Cached")
    raw = tmp_path / "store" / "raw" / "cifar-10-python.tar.gz"
    raw.write_bytes(raw.read_bytes()[:-1] + b"x")  # the archive changed on storage
    next(Path(dataset_uri).glob("train-*.parquet")).write_bytes(b"corrupt")
    damaged, _ = _states(url, md5, tmp_path, scheduler)
    assert (damaged["download"], damaged["preprocess"]) == ("Completed", "Completed")
    healed, _ = _states(url, md5, tmp_path, scheduler)
    assert (healed["download"], healed["preprocess"]) == ("Cached", "Cached")
    for record in (tmp_path / "store" / "cache").iterdir():  # the cache's own files damaged
        record.write_bytes(b"{not a result record")
    recomputed, _ = _states(url, md5, tmp_path, scheduler)
    assert (recomputed["download"], recomputed["preprocess"]) == ("Completed", "Completed")


def test_caching_unwritable_cache_folder_runs_uncached_with_a_warning(
    prefect_server: None,
    dask_client: Any,
    archive: tuple[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, md5 = archive
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "cache").write_text("a file where the cache folder would be")
    with caplog.at_level(logging.WARNING, logger="tasks.caching"):
        for _ in range(2):
            states, _ = _states(url, md5, tmp_path, dask_client.scheduler.address)
            assert (states["download"], states["preprocess"]) == ("Completed", "Completed")
    warnings = [r.getMessage() for r in caplog.records if r.name == "tasks.caching"]
    assert warnings and "Data steps run without Prefect's cache" in warnings[0]


def test_caching_keeps_records_where_the_operator_says_one_folder_per_storage_path(
    prefect_server: None,
    dask_client: Any,
    archive: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, md5 = archive
    records = tmp_path / "records"
    monkeypatch.setenv("CIFAR_CACHE_PATH", str(records))
    scheduler = dask_client.scheduler.address
    first, _ = _states(url, md5, tmp_path, scheduler)
    again, _ = _states(url, md5, tmp_path, scheduler)
    assert (first["download"], again["download"]) == ("Completed", "Cached")
    assert not (tmp_path / "store" / "cache").exists()  # none beside the data
    [folder] = records.iterdir()
    assert len(list(folder.iterdir())) >= 2  # download's and preprocess's records
    # another storage path has records of its own: nothing cached for it yet
    elsewhere, _ = _states(url, md5, tmp_path / "elsewhere", scheduler)
    assert elsewhere["download"] == "Completed"
    assert len(list(records.iterdir())) == 2


def test_caching_options_that_are_not_json_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CIFAR_CACHE_STORAGE_OPTIONS", "profile=cache")
    with pytest.raises(ValueError, match=r"\$CIFAR_CACHE_STORAGE_OPTIONS is not JSON"):
        StorageLayout.at("/tmp/store")

"""The storage layout: every location built in one place, local paths and URLs alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.layout import StorageLayout


def test_layout_expands_home_and_makes_paths_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    assert StorageLayout.at("~/cifar/").root == "/home/someone/cifar"
    assert StorageLayout.at("data").root == os.path.join(os.getcwd(), "data")


def test_layout_locations_under_a_url() -> None:
    layout = StorageLayout.at("s3://bucket/prefix/")
    assert layout.root == "s3://bucket/prefix"
    assert layout.raw_archive("https://host/x/cifar-10-python.tar.gz") == (
        "s3://bucket/prefix/raw/cifar-10-python.tar.gz"
    )
    assert layout.dataset("d1") == "s3://bucket/prefix/datasets/d1"
    assert layout.runs == "s3://bucket/prefix/runs"
    assert layout.predictions("abc") == "s3://bucket/prefix/predictions/abc.csv"
    assert layout.synthetic_archive == "s3://bucket/prefix/synthetic/cifar-10-python.tar.gz"


def test_layout_refuses_an_empty_path() -> None:
    with pytest.raises(ValueError, match="storage_path is empty"):
        StorageLayout.at(" ")


def test_layout_not_writable_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    layout = StorageLayout.at(str(tmp_path / "file" / "store"))
    with pytest.raises(PermissionError, match=r"Cannot write under storage_path .*file/store"):
        layout.check_writable()
    StorageLayout.at(str(tmp_path / "ok")).check_writable()
    assert os.listdir(tmp_path / "ok") == []

"""Downloading the archive: streamed from any HTTP server, retried while the network fails,
permanent failures at once, each with a message that says what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cifar.format import OFFICIAL_MD5, OFFICIAL_URL, write_synthetic_archive
from tasks.download import ChecksumError, Retry, download_archive, expected_md5
from tasks.download_failures import DownloadError, describe_failure
from tasks.layout import StorageLayout
from tests.conftest import HttpDir, ScriptedHttp

FAST = Retry(tries=3, backoff_s=0.01)


@pytest.fixture(scope="module")
def big_archive(http_dir: HttpDir) -> tuple[str, str]:
    """An archive larger than fsspec's 5 MB block: served whole by a server without Range."""
    path = http_dir.path / "big.tar.gz"
    md5 = write_synthetic_archive(str(path), images_per_batch=400)
    assert path.stat().st_size > 6 * 1024 * 1024
    return f"{http_dir.url}/big.tar.gz", md5


def test_download_streams_from_a_server_without_range_and_skips_second_time(
    big_archive: tuple[str, str], tmp_path: Path
) -> None:
    url, md5 = big_archive
    layout = StorageLayout.at(str(tmp_path))
    first = download_archive(url, layout, md5, FAST)
    assert first.verified and first.md5 == md5
    assert first.uri == f"{tmp_path}/raw/big.tar.gz"
    stamp = os.stat(first.uri).st_mtime_ns
    assert download_archive(url, layout, md5, FAST) == first
    assert os.stat(first.uri).st_mtime_ns == stamp


@pytest.mark.parametrize("status", [503, 429, 500])
def test_download_retries_transient_http_errors(
    big_archive: tuple[str, str], scripted_http: ScriptedHttp, tmp_path: Path, status: int
) -> None:
    _, md5 = big_archive
    scripted_http.statuses[:] = [status, status]
    archive = download_archive(
        f"{scripted_http.url}/big.tar.gz", StorageLayout.at(str(tmp_path)), md5, FAST
    )
    assert archive.verified and not scripted_http.statuses


def test_download_not_found_fails_at_once_and_says_what_to_do(
    scripted_http: ScriptedHttp, tmp_path: Path
) -> None:
    scripted_http.statuses[:] = [404] * 10
    with pytest.raises(DownloadError, match=r"HTTP 404 .*Check data_url") as caught:
        download_archive(
            f"{scripted_http.url}/nope.tar.gz", StorageLayout.at(str(tmp_path)), None, FAST
        )
    assert not caught.value.transient and caught.value.tries == 1
    assert len(scripted_http.requests) <= 2  # fsspec's HEAD and GET of one try
    assert os.listdir(tmp_path / "raw") == []


def test_download_unreachable_host_is_retried_then_explained(tmp_path: Path) -> None:
    layout = StorageLayout.at(str(tmp_path))
    with pytest.raises(DownloadError) as caught:
        download_archive("http://127.0.0.1:1/cifar-10-python.tar.gz", layout, None, FAST)
    assert str(caught.value).startswith(
        "Cannot reach 127.0.0.1 (connection refused) after 3 tries. Check the network"
    )
    assert "make run-offline" in str(caught.value)
    assert os.listdir(tmp_path / "raw") == []


def test_download_name_resolution_failure_is_named(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"Cannot reach no-such-host.invalid \(name resolution"):
        download_archive(
            "http://no-such-host.invalid/a.tar.gz",
            StorageLayout.at(str(tmp_path)),
            None,
            Retry(tries=1),
        )


def test_download_wrong_checksum_leaves_nothing(
    big_archive: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = big_archive
    with pytest.raises(ChecksumError, match=r"expected 0{32}; .* pass the right data_md5"):
        download_archive(url, StorageLayout.at(str(tmp_path)), "0" * 32, FAST)
    assert os.listdir(tmp_path / "raw") == []


def test_download_without_checksum_is_unverified(tmp_path: Path) -> None:
    md5 = write_synthetic_archive(str(tmp_path / "src.tar.gz"), images_per_batch=5)
    archive = download_archive(
        f"file://{tmp_path}/src.tar.gz", StorageLayout.at(str(tmp_path / "store")), None
    )
    assert (archive.verified, archive.md5) == (False, md5) and Path(archive.uri).is_file()


def test_download_missing_local_file_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"no such file\. Check data_url"):
        download_archive(f"file://{tmp_path}/none.tar.gz", StorageLayout.at(str(tmp_path)), None)


def test_download_expected_md5_defaults_to_the_official_one_for_the_official_url() -> None:
    assert expected_md5(OFFICIAL_URL, None) == OFFICIAL_MD5
    assert expected_md5("https://mirror/cifar.tgz", None) is None
    assert expected_md5(OFFICIAL_URL, "abc") == "abc"


def test_download_failure_causes_in_plain_words() -> None:
    refused = FileNotFoundError("http://h/x")
    refused.__cause__ = ConnectionRefusedError(111, "refused")
    assert describe_failure(refused) == ("connection refused", True)
    assert describe_failure(TimeoutError()) == ("timed out", True)
    assert describe_failure(PermissionError("denied"))[1] is False

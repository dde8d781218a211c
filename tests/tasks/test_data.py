from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from tasks.cifar import write_synthetic_archive
from tasks.data import ChecksumError, UnsafeArchiveError, download_archive, extract_archive
from tests.conftest import HttpDir


@pytest.fixture(scope="module")
def served_archive(http_dir: HttpDir) -> tuple[str, str]:
    md5 = write_synthetic_archive(
        str(http_dir.path / "cifar-10-python.tar.gz"), images_per_batch=10
    )
    return f"{http_dir.url}/cifar-10-python.tar.gz", md5


def test_download_over_http_verifies_and_skips_second_time(
    served_archive: tuple[str, str], tmp_path: Path
) -> None:
    url, md5 = served_archive
    first = download_archive(url, str(tmp_path), md5)
    assert first.verified and first.md5 == md5
    assert first.uri == f"{tmp_path}/raw/cifar-10-python.tar.gz"
    stamp = os.stat(first.uri).st_mtime_ns
    second = download_archive(url, str(tmp_path), md5)
    assert second == first and os.stat(first.uri).st_mtime_ns == stamp


def test_download_wrong_checksum_leaves_nothing(
    served_archive: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = served_archive
    with pytest.raises(ChecksumError, match=r"expected 0{32}; .* pass the right data_md5"):
        download_archive(url, str(tmp_path), "0" * 32)
    assert os.listdir(tmp_path / "raw") == []


def test_download_without_checksum_is_unverified(
    served_archive: tuple[str, str], tmp_path: Path
) -> None:
    url, md5 = served_archive
    archive = download_archive(url, str(tmp_path), None)
    assert (archive.verified, archive.md5) == (False, md5)


def test_download_from_file_url(tmp_path: Path) -> None:
    md5 = write_synthetic_archive(str(tmp_path / "src.tar.gz"), images_per_batch=5)
    archive = download_archive(f"file://{tmp_path}/src.tar.gz", str(tmp_path / "store"), md5)
    assert archive.verified and Path(archive.uri).is_file()


def _tar_with(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"") -> str:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return str(path)


def test_extract_refuses_path_traversal(tmp_path: Path) -> None:
    member = tarfile.TarInfo("../../evil.txt")
    member.size = 4
    with pytest.raises(UnsafeArchiveError, match="escapes the target directory"):
        extract_archive(_tar_with(tmp_path, member, b"evil"), str(tmp_path / "out"))
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()


def test_extract_refuses_links(tmp_path: Path) -> None:
    member = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(UnsafeArchiveError, match="link or special file"):
        extract_archive(_tar_with(tmp_path, member), str(tmp_path / "out"))


def test_extract_truncated_archive_says_so(tmp_path: Path) -> None:
    write_synthetic_archive(str(tmp_path / "a.tar.gz"), images_per_batch=50)
    data = (tmp_path / "a.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="may be truncated"):
        extract_archive(str(tmp_path / "cut.tar.gz"), str(tmp_path / "out"))

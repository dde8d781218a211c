"""Safe extraction: no path escapes, no links, truncated or foreign archives named as such."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from cifar.archive import extract_archive
from cifar.errors import NotCifarArchiveError, UnsafeArchiveError
from cifar.format import write_synthetic_archive


def _tar_with(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"") -> str:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return str(path)


def test_archive_extracts_the_cifar_batches(tmp_path: Path) -> None:
    write_synthetic_archive(str(tmp_path / "a.tar.gz"), images_per_batch=5)
    batches = Path(extract_archive(str(tmp_path / "a.tar.gz"), str(tmp_path / "out")))
    assert sorted(p.name for p in batches.iterdir())[:2] == ["batches.meta", "data_batch_1"]


def test_archive_refuses_path_traversal(tmp_path: Path) -> None:
    member = tarfile.TarInfo("../../evil.txt")
    member.size = 4
    with pytest.raises(UnsafeArchiveError, match="escapes the target directory"):
        extract_archive(_tar_with(tmp_path, member, b"evil"), str(tmp_path / "out"))
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()


def test_archive_refuses_links(tmp_path: Path) -> None:
    member = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(UnsafeArchiveError, match="link or special file"):
        extract_archive(_tar_with(tmp_path, member), str(tmp_path / "out"))


def test_archive_truncated_says_so(tmp_path: Path) -> None:
    write_synthetic_archive(str(tmp_path / "a.tar.gz"), images_per_batch=50)
    data = (tmp_path / "a.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(NotCifarArchiveError, match="may be truncated"):
        extract_archive(str(tmp_path / "cut.tar.gz"), str(tmp_path / "out"))


def test_archive_other_tarball_names_what_is_missing(tmp_path: Path) -> None:
    member = tarfile.TarInfo("photos/cat.jpg")
    member.size = 3
    with pytest.raises(NotCifarArchiveError, match="not a CIFAR-10 python archive: it lacks"):
        extract_archive(_tar_with(tmp_path, member, b"cat"), str(tmp_path / "out"))


def test_archive_not_a_tarball_at_all(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text("<html>404</html>")
    with pytest.raises(NotCifarArchiveError, match=r"cannot be read as a tar\.gz archive"):
        extract_archive(str(tmp_path / "page.html"), str(tmp_path / "out"))

"""Where a Tuner's Optuna study is kept by default: a SQLite file in the search's directory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

STUDY_FILE = "study.db"  # the study's SQLite file in the search's directory, by default


def sqlite_url(filesystem: AbstractFileSystem, directory: str) -> str:
    """The default study storage: a SQLite file in the search's (local) directory.

    Raises:
        ConfigError: The directory is not on the local filesystem.
    """
    protocol = filesystem.protocol
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    if "file" not in protocols and "local" not in protocols:
        raise ConfigError(
            f"The Optuna study cannot be a sqlite file on {directory} ({protocols[0]}); "
            "give TuneConfig(study_storage='postgresql://...') or a local storage_path."
        )
    return f"sqlite:///{directory}/{STUDY_FILE}"

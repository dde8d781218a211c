"""What ``Tuner.restore`` reads back besides the trainable: the search's param space,
TuneConfig and RunConfig, pickled beside its study as ``tuner.pkl`` by its first ``fit()``."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import cloudpickle

from trainlib._internal.common.storage import RunStorage
from trainlib._locations import locate
from trainlib.config import RunConfig
from trainlib.errors import ConfigError
from trainlib.tune.config import TuneConfig

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from trainlib.tune._study import Failed

logger = logging.getLogger(__name__)

TUNER_FILE = "tuner.pkl"


def save(
    experiment: RunStorage,
    param_space: Mapping[str, Any],
    tune_config: TuneConfig,
    run_config: RunConfig,
) -> None:
    """Store what ``read`` gives back, in the search's directory ``experiment``; a RunConfig
    whose callbacks cannot be pickled is stored without them."""
    location, name = posixpath.split(experiment.run_dir)
    run_config = replace(run_config, name=name, storage_path=experiment.url(location))
    saved = {"param_space": param_space, "tune_config": tune_config}
    try:
        payload = cloudpickle.dumps({**saved, "run_config": run_config})
    except Exception as exc:  # a callback that cannot be pickled: restore without it
        logger.warning("Tuner %s: its RunConfig cannot be saved for restore (%s)", name, exc)
        payload = cloudpickle.dumps({**saved, "run_config": replace(run_config, callbacks=[])})
    experiment.filesystem.pipe_file(posixpath.join(experiment.run_dir, TUNER_FILE), payload)


def exists(path: str) -> bool:
    """Whether the search directory ``path`` holds a saved search."""
    filesystem, directory = locate(path)
    return bool(filesystem.exists(posixpath.join(directory, TUNER_FILE)))


def read(path: str, filesystem: AbstractFileSystem | None = None) -> dict[str, Any]:
    """The saved search at ``path`` (on ``filesystem``, else inferred): ``param_space``,
    ``tune_config`` and ``run_config``, the run config storing where ``path`` is now (a search
    directory may have been moved or copied since).

    Raises:
        ConfigError: No search is saved there.
    """
    given = filesystem
    filesystem, directory = locate(path, filesystem)
    saved_file = posixpath.join(directory, TUNER_FILE)
    if not filesystem.exists(saved_file):
        raise ConfigError(
            f"Tuner.restore({path!r}): no search is stored there (no {TUNER_FILE}); give the "
            "search's directory, {storage_path}/{name}, of a Tuner that was fit() before."
        )
    saved: dict[str, Any] = cloudpickle.loads(filesystem.cat_file(saved_file))
    location, name = posixpath.split(directory.rstrip("/"))
    run_config: RunConfig = saved["run_config"]
    saved["run_config"] = replace(
        run_config,
        name=name,
        storage_path=str(filesystem.unstrip_protocol(location)),
        storage_filesystem=given or run_config.storage_filesystem,
    )
    return saved


def failed_trials(resume_errored: bool, restart_errored: bool) -> Failed:
    """What a restored search does with its failed trials (``Tuner.restore``'s flags).

    Raises:
        ConfigError: Both flags.
    """
    if resume_errored and restart_errored:
        raise ConfigError(
            "Tuner.restore(resume_errored=True, restart_errored=True): choose one: resume "
            "failed trials from their checkpoints, or restart them from scratch."
        )
    return "resume" if resume_errored else "restart" if restart_errored else "keep"

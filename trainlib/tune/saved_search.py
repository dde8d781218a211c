"""What ``Tuner.restore`` reads back besides the trainable: the search's param space,
TuneConfig and RunConfig, pickled beside its study as ``tuner.pkl`` by its ``fit()``, and which
search of the directory is the latest (``search.json``).

As in Ray, each new ``Tuner`` runs a search of its own, even where a directory of the same name
holds earlier ones: the first search of a directory is its study ``{name}`` with trials
``trial_NNNNN``; the k-th is ``{name}-k`` with trials ``trial_k_NNNNN``. ``Tuner.restore``
(and ``ExperimentAnalysis``) take the latest.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, replace
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
SEARCH_FILE = "search.json"


@dataclass(frozen=True)
class Search:
    """One search of a search directory: its Optuna study's name and its place (1: the
    directory's first)."""

    study: str
    index: int

    @property
    def trial_names(self) -> str:
        """The template of its trials' run names (``str.format`` of the trial's number)."""
        return "trial_{:05d}" if self.index == 1 else f"trial_{self.index}_{{:05d}}"


def new_search(experiment: RunStorage) -> Search:
    """A search of its own in ``experiment``, after the ones stored there."""
    name = posixpath.basename(experiment.run_dir.rstrip("/"))
    latest = _latest(experiment.filesystem, experiment.run_dir)
    if latest is None:
        return Search(name, 1)
    return Search(f"{name}-{latest.index + 1}", latest.index + 1)


def _latest(filesystem: AbstractFileSystem, directory: str) -> Search | None:
    """The latest search stored in ``directory``; None: none is."""
    if not filesystem.exists(posixpath.join(directory, TUNER_FILE)):
        return None
    try:
        named = json.loads(filesystem.cat_file(posixpath.join(directory, SEARCH_FILE)))
        return Search(str(named["study"]), int(named["index"]))
    except FileNotFoundError:  # saved before searches were told apart: its first
        return Search(posixpath.basename(directory.rstrip("/")), 1)


def save(
    experiment: RunStorage,
    search: Search,
    param_space: Mapping[str, Any],
    tune_config: TuneConfig,
    run_config: RunConfig,
) -> None:
    """Store what ``read`` gives back, in the search's directory ``experiment``, ``search``
    as its latest; a RunConfig whose callbacks cannot be pickled is stored without them."""
    location, name = posixpath.split(experiment.run_dir)
    run_config = replace(run_config, name=name, storage_path=experiment.url(location))
    saved = {"param_space": param_space, "tune_config": tune_config}
    try:
        payload = cloudpickle.dumps({**saved, "run_config": run_config})
    except Exception as exc:  # a callback that cannot be pickled: restore without it
        logger.warning("Tuner %s: its RunConfig cannot be saved for restore (%s)", name, exc)
        payload = cloudpickle.dumps({**saved, "run_config": replace(run_config, callbacks=[])})
    experiment.filesystem.pipe_file(posixpath.join(experiment.run_dir, TUNER_FILE), payload)
    named = json.dumps({"study": search.study, "index": search.index}).encode()
    experiment.filesystem.pipe_file(posixpath.join(experiment.run_dir, SEARCH_FILE), named)


def exists(path: str) -> bool:
    """Whether the search directory ``path`` holds a saved search."""
    filesystem, directory = locate(path)
    return bool(filesystem.exists(posixpath.join(directory, TUNER_FILE)))


def read(path: str, filesystem: AbstractFileSystem | None = None) -> dict[str, Any]:
    """The latest search saved at ``path`` (on ``filesystem``, else inferred):
    ``param_space``, ``tune_config``, ``run_config`` (storing where ``path`` is now: a search
    directory may have been moved or copied since) and ``search``.

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
    saved["search"] = _latest(filesystem, directory)
    return saved


def placed(run_config: RunConfig, saved: dict[str, Any]) -> RunConfig:
    """``run_config`` naming and storing where the ``saved`` search is."""
    stored: RunConfig = saved["run_config"]
    return replace(
        run_config,
        name=stored.name,
        storage_path=stored.storage_path,
        storage_filesystem=stored.storage_filesystem,
    )


def latest(path: str, filesystem: AbstractFileSystem | None = None) -> Search | None:
    """The latest search stored at ``path``; None: none is."""
    filesystem, directory = locate(path, filesystem)
    return _latest(filesystem, directory)


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

"""Searches of one directory told apart (saved_search): each new Tuner's search after the
latest stored there, its trials named apart; a directory saved before searches were told apart
holds the first."""

from __future__ import annotations

from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from trainlib import RunConfig
from trainlib._internal.common.storage import RunStorage
from trainlib.tune import TuneConfig, saved_search
from trainlib.tune.saved_search import Search


def _experiment(tmp_path: Path) -> RunStorage:
    return RunStorage.create(str(tmp_path), "search", None)


def test_saved_search_each_new_search_comes_after_the_latest(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path)
    assert saved_search.latest(experiment.run_dir) is None
    names = []
    for _ in range(4):
        search = saved_search.new_search(experiment)
        saved_search.save(experiment, search, {"x": 1}, TuneConfig(), RunConfig(name="search"))
        assert saved_search.latest(experiment.run_dir) == search
        assert saved_search.read(experiment.run_dir)["search"] == search
        names.append((search.study, search.trial_names.format(7)))
    assert names == [
        ("search", "trial_00007"),
        ("search-2", "trial_2_00007"),
        ("search-3", "trial_3_00007"),
        ("search-4", "trial_4_00007"),
    ]


def test_saved_search_saved_before_searches_were_told_apart_is_the_first(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path)
    saved_search.save(experiment, Search("search", 1), {}, TuneConfig(), RunConfig(name="search"))
    LocalFileSystem().rm(str(Path(experiment.run_dir) / saved_search.SEARCH_FILE))
    assert saved_search.latest(experiment.run_dir) == Search("search", 1)
    assert saved_search.new_search(experiment) == Search("search-2", 2)

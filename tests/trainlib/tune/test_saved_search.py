"""Searches of one directory told apart (saved_search): each new Tuner's search after the
latest stored there, its trials named apart; a directory saved before searches were told apart
holds the first; tune.run(resume=) as Ray's, over every value."""

from __future__ import annotations

from pathlib import Path

from fsspec.implementations.local import LocalFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

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


_BASES = ["AUTO", "LOCAL", "REMOTE", "PROMPT", "auto", "NOPE", ""]
_TAILS = ["", "+ERRORED", "+RESTART_ERRORED", "+ERRORED_ONLY", "+RESTART_ERRORED_ONLY", "+X"]


@settings(max_examples=200, deadline=None)
@given(
    resume=st.sampled_from([True, False])
    | st.builds(str.__add__, st.sampled_from(_BASES), st.sampled_from(_TAILS)),
    stored=st.booleans(),
)
def test_tune_run_resume_as_rays(tmp_path_factory, resume, stored) -> None:
    """Ray's resume= values: a new search (False, or AUTO with none stored), the stored one
    with Ray's flags, or a ConfigError naming what to give; never another error."""
    from trainlib import ConfigError
    from trainlib.tune.run import _resumed

    root = tmp_path_factory.mktemp("runs")
    if stored:
        experiment = RunStorage.create(str(root), "search", None)
        saved_search.save(experiment, Search("search", 1), {}, TuneConfig(), RunConfig())
    text = "LOCAL" if resume is True else str(resume).upper()
    base, _, tail = text.partition("+")
    valid = base in ("AUTO", "LOCAL", "REMOTE") and ("+" + tail if tail else "") in _TAILS[:5]
    try:
        flags = _resumed(resume, "search", str(root))
    except ConfigError:
        assert resume is not False and (not valid or (not stored and base != "AUTO"))
        return
    if resume is False or not stored:
        assert flags is None and (resume is False or base == "AUTO")
        return
    assert valid and flags is not None
    unfinished, errored, restarted = flags
    assert unfinished == (not tail.endswith("_ONLY"))
    assert errored == tail.startswith("ERRORED") and restarted == tail.startswith("RESTART")

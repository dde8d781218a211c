"""A search's callbacks hear its trials as Ray Tune's do: Ray's hooks with keyword arguments,
one ``Trial`` object a trial, ``iteration`` rising, trainlib's own hooks beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from trainlib.checkpoint import Checkpoint
from trainlib.tune import Callback, Trial
from trainlib.tune.logger import JsonLoggerCallback
from trainlib.tune.search_events import SearchEvents


class RaysHooks(Callback):
    """Ray's signatures, as Ray's docs write them."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, int, str, Any]] = []

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("setup", 0, "", (stop, num_samples, total_num_samples)))

    def on_trial_start(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("start", iteration, trial.trial_id, [str(t) for t in trials]))

    def on_trial_result(self, iteration, trials, trial, result, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("result", iteration, trial.trial_id, result))

    def on_trial_save(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("save", iteration, trial.trial_id, None))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("checkpoint", iteration, trial.trial_id, checkpoint.path))

    def on_trial_complete(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("complete", iteration, trial.trial_id, trial.status))

    def on_trial_error(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("error", iteration, trial.trial_id, trial.status))

    def on_experiment_end(self, trials, **info):  # type: ignore[no-untyped-def]
        self.heard.append(("end", 0, "", [t.status for t in trials]))


class TrainlibHooks(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, Trial]] = []

    def on_trial_start(self, trial: Trial) -> None:
        self.seen.append(("start", trial))

    def on_trial_end(self, trial: Trial) -> None:
        self.seen.append(("end", trial))


def _events(tmp_path: Path, *callbacks: Callback) -> SearchEvents:
    return SearchEvents(list(callbacks), LocalFileSystem(), str(tmp_path / "search"))


def test_rays_hooks_hear_every_event_in_order_with_one_trial_object(tmp_path: Path) -> None:
    rays, own = RaysHooks(), TrainlibHooks()
    events = _events(tmp_path, rays, own)
    events.setup({"training_iteration": 3}, 2, 4)
    first = events.trial(0, "trial_00000", {"lr": 0.1})
    second = events.trial(1, "trial_00001", {"lr": 0.2})
    events.started(first)
    events.started(second)
    events.result("trial_00000", {"loss": 1.0, "training_iteration": 1}, None)
    checkpoint = Checkpoint.from_directory(str(tmp_path))
    events.result("trial_00001", {"loss": 2.0, "training_iteration": 1}, checkpoint)
    first.state = "complete"
    events.ended(first)
    second.state = "failed"
    events.ended(second)
    events.experiment_ended()

    kinds = [(kind, trial) for kind, _, trial, _ in rays.heard]
    assert kinds == [
        ("setup", ""),
        ("start", "trial_00000"),
        ("start", "trial_00001"),
        ("result", "trial_00000"),
        ("result", "trial_00001"),
        ("save", "trial_00001"),
        ("checkpoint", "trial_00001"),
        ("complete", "trial_00000"),
        ("error", "trial_00001"),
        ("end", ""),
    ]
    assert rays.heard[0][3] == ({"training_iteration": 3}, 2, 4)
    assert rays.heard[2][3] == ["trial_00000", "trial_00001"]  # every trial started so far
    iterations = [i for kind, i, _, _ in rays.heard if kind not in ("setup", "end")]
    assert iterations == sorted(iterations) and iterations[0] >= 1
    assert rays.heard[3][3] == {"loss": 1.0, "training_iteration": 1, "config": {"lr": 0.1}}
    assert rays.heard[7][3] == "TERMINATED" and rays.heard[8][3] == "ERROR"
    assert rays.heard[-1][3] == ["TERMINATED", "ERROR"]
    # trainlib's own hooks: the same objects, as Ray's
    assert [(k, t.name) for k, t in own.seen] == [
        ("start", "trial_00000"),
        ("start", "trial_00001"),
        ("end", "trial_00000"),
        ("end", "trial_00001"),
    ]
    assert own.seen[0][1] is own.seen[2][1] is first
    assert first.last_result["loss"] == 1.0 and len({first, second, first}) == 2  # hashable
    assert first.local_path == first.path == str(tmp_path / "search" / "trial_00000")
    assert Path(first.local_path).is_dir()


def test_a_result_of_a_run_that_is_no_trial_is_heard_by_nobody(tmp_path: Path) -> None:
    rays = RaysHooks()
    _events(tmp_path, rays).result("elsewhere", {"loss": 1.0}, None)
    assert rays.heard == []


def test_a_trial_on_remote_storage_writes_locally_and_its_files_are_uploaded_at_its_end() -> None:
    remote = fsspec.filesystem("memory")
    remote.pipe_file("/searches/remote/trial_00000/result.json", b'{"training_iteration": 1}\n')
    remote.pipe_file("/searches/remote/trial_00000/checkpoint_000000/model.pt", b"weights")
    events = SearchEvents([JsonLoggerCallback()], remote, "/searches/remote")
    trial = events.trial(0, "trial_00000", {"lr": 0.1})
    events.started(trial)  # a trial resumed: its files come back, its checkpoints stay there
    local = Path(trial.local_path)
    assert not trial.local_path.startswith("/searches") and local.is_dir()
    assert sorted(p.name for p in local.iterdir()) == ["params.json", "result.json"]
    events.result("trial_00000", {"training_iteration": 2}, None)
    trial.state = "complete"
    events.ended(trial)
    lines = remote.cat_file("/searches/remote/trial_00000/result.json").decode().splitlines()
    assert [json.loads(line)["training_iteration"] for line in lines] == [1, 2]
    assert remote.cat_file("/searches/remote/trial_00000/params.json")
    assert not local.exists()  # uploaded, then removed


def test_a_trial_cut_off_on_remote_storage_still_uploads_its_files() -> None:
    remote = fsspec.filesystem("memory")
    events = SearchEvents([JsonLoggerCallback()], remote, "/searches/cut")
    trial = events.trial(0, "trial_00000", {})
    events.started(trial)
    events.result("trial_00000", {"training_iteration": 1}, None)
    events.left(trial)  # Ctrl-C: no end heard
    assert remote.cat_file("/searches/cut/trial_00000/result.json").count(b"\n") == 1

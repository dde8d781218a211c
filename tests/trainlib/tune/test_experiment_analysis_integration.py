"""Ray Tune's ``ExperimentAnalysis``: what ``tune.run`` returns, and a stored search read back
from its directory, also after the directory moved (``Tuner.restore(storage_filesystem=)``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import fsspec
import pytest
from distributed import Client

from tests.trainlib.tune.trainables import CURVES, report_a_curve
from trainlib import ConfigError, tune


def _by_shape(analysis: tune.ExperimentAnalysis) -> dict[str, tune.Trial]:
    return {trial.config["shape"]: trial for trial in analysis.trials}


def _check(analysis: tune.ExperimentAnalysis, root: Path) -> None:
    """What Ray's accessors give for the two curves: dip 5, 1, 4 and flat 3, 3, 3 (min)."""
    trials = _by_shape(analysis)
    dip, flat = trials["dip"], trials["flat"]
    assert analysis.best_config == {"shape": "flat"}  # last loss 3 < 4
    assert analysis.get_best_config(scope="all") == {"shape": "dip"}  # best loss 1 < 3
    assert analysis.get_best_config(scope="avg") == {"shape": "flat"}  # 3 < 10/3
    assert analysis.get_best_config("loss", "max") == {"shape": "dip"}  # last 4 > 3
    assert analysis.best_trial is flat and analysis.best_logdir == flat.path
    assert Path(flat.path).parent == root
    assert analysis.best_result["loss"] == 3.0
    assert analysis.results[dip.trial_id]["loss"] == 4.0
    assert analysis.results_df.loc[dip.trial_id, "loss"] == 4.0
    assert analysis.trial_dataframes[dip.trial_id]["loss"].tolist() == CURVES["dip"]
    assert analysis.best_dataframe["loss"].tolist() == CURVES["flat"]
    best_rows = analysis.dataframe(metric="loss", mode="min").set_index("trial_id")
    assert best_rows.loc[dip.trial_id, "loss"] == 1.0  # each trial's best report
    assert best_rows.loc[dip.trial_id, "training_iteration"] == 2

    best = analysis.get_best_checkpoint(dip)  # dip's best: loss 1, its second report
    assert best is not None and Path(best.path).name == "checkpoint_000001"
    with best.as_directory() as directory:
        assert (Path(directory) / "loss").read_text() == "1.0"
    last = analysis.get_last_checkpoint(dip)
    assert last is not None and Path(last.path).name == "checkpoint_000002"
    assert Path(last.path).is_relative_to(root)
    kept = analysis.get_trial_checkpoints_paths(dip, "loss")
    assert sorted(value for _, value in kept) == sorted(CURVES["dip"])
    assert analysis.get_all_configs() == {t.path: t.config for t in analysis.trials}
    # a ResultGrid too
    assert analysis.get_best_result().config == {"shape": "flat"}
    assert [t.status for t in analysis.trials] == ["TERMINATED", "TERMINATED"]


def test_tune_run_returns_rays_analysis_and_a_moved_search_reads_back(
    dask_client: Client, tmp_path: Path
) -> None:
    analysis = tune.run(
        report_a_curve,
        config={"shape": tune.grid_search(["dip", "flat"])},
        metric="loss",
        mode="min",
        name="curves",
        storage_path=str(tmp_path / "runs"),
        client=dask_client,
    )
    assert isinstance(analysis, tune.ExperimentAnalysis)
    _check(analysis, tmp_path / "runs" / "curves")

    moved = tmp_path / "elsewhere" / "curves"  # copied off a cluster's storage, say
    shutil.copytree(tmp_path / "runs" / "curves", moved)
    shutil.rmtree(tmp_path / "runs")
    _check(tune.ExperimentAnalysis(str(moved)), moved)
    on_filesystem = tune.ExperimentAnalysis(
        str(moved), storage_filesystem=fsspec.filesystem("file")
    )
    _check(on_filesystem, moved)
    restored = tune.Tuner.restore(
        str(moved), report_a_curve, storage_filesystem=fsspec.filesystem("file")
    )
    assert sorted(r.metrics["loss"] for r in restored.get_results()) == [3.0, 4.0]

    unnamed = tune.ExperimentAnalysis(str(moved), default_metric="loss", default_mode="max")
    assert unnamed.best_config == {"shape": "dip"}  # the defaults given win
    with pytest.raises(ConfigError, match="no search is stored there"):
        tune.ExperimentAnalysis(str(tmp_path / "runs" / "curves"))

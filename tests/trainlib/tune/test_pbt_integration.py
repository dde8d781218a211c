"""Population Based Training on a real 2-worker LocalCluster: the worse trial exploits the
better one (its checkpoint copied in, its config explored) and resumes from the donor's step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from distributed import Client

from tests.trainlib.tune.trainables import population_member
from trainlib import RunConfig, tune
from trainlib.tune.schedulers import PopulationBasedTraining


def test_pbt_worse_trial_resumes_from_the_better_trials_checkpoint_with_an_explored_config(
    dask_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    caplog.set_level(logging.INFO, logger="trainlib.tune.schedulers.pbt")
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        metric="score",
        mode="max",
        hyperparam_mutations={"quality": [1.0, 2.0, 3.0]},
        resample_probability=0.0,  # a move: 2.0, the donor's, becomes 1.0 or 3.0
    )
    grid = tune.Tuner(
        population_member,
        param_space={"quality": tune.grid_search([1.0, 2.0]), "steps": 4, "out": str(out)},
        tune_config=tune.TuneConfig(scheduler=pbt, max_concurrent_trials=2),
        run_config=RunConfig(name="pbt", storage_path=str(tmp_path)),
        client=dask_client,
    ).fit()
    assert grid.num_errors == 0
    by_name = {Path(r.path).name: r for r in grid}
    decisions = [
        json.loads(line) for line in (tmp_path / "pbt" / "pbt_global.txt").read_text().splitlines()
    ]
    trial, donor, iteration, _, donor_config, new_config = decisions[0]
    exploited, chosen = by_name[trial], by_name[donor]
    # At its 2nd report the quality-1.0 trial was the bottom one, the 2.0 one the top.
    assert iteration == 2
    assert exploited.metrics_history[0]["score"] == 1.0
    assert chosen.metrics_history[0]["score"] == 2.0
    assert donor_config == {"quality": 2.0, "steps": 4, "out": str(out)}
    assert new_config == {**donor_config, "quality": new_config["quality"]}
    assert new_config["quality"] in (1.0, 3.0)
    history = exploited.metrics_history
    assert [h["step"] for h in history[:2]] == [1, 2]  # its own first two steps
    assert [h["resumed_origin"] for h in history[:2]] == [None, None]
    after = history[2]  # the first report after the exploit
    assert after["resumed_origin"] == donor
    assert after["resumed_step"] in (1, 2)  # the donor's latest checkpoint then
    assert after["step"] == after["resumed_step"] + 1
    assert after["score"] == new_config["quality"]
    assert [h["training_iteration"] for h in history] == list(range(1, len(history) + 1))
    # The copy is the trial's checkpoint of its 2nd report, as the donor committed it.
    adopted = (tmp_path / "pbt" / trial / "checkpoint_000001" / "state.json").read_text()
    assert json.loads(adopted) == {"step": after["resumed_step"], "origin": donor}
    policy = (tmp_path / "pbt" / f"pbt_policy_{trial}.txt").read_text().splitlines()
    assert json.loads(policy[0]) == decisions[0]
    assert exploited.config == [d for d in decisions if d[0] == trial][-1][5]  # its last
    assert any(
        m.startswith(f"[exploit] transferring weights from trial {donor}") for m in caplog.messages
    )

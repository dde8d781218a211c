"""PopulationBasedTraining's decisions (who exploits whom, when) and its explore step, as Ray
defines them; its argument checks."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from trainlib import ConfigError, tune
from trainlib.tune.schedulers import PopulationBasedTraining
from trainlib.tune.schedulers.mutations import explore
from trainlib.tune.schedulers.population import Population


def population(tmp_path: Path, **kwargs: Any) -> Population:
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.1, 0.01, 0.001]},
        **kwargs,
    )
    return Population(pbt, "score", "max", str(tmp_path), LocalFileSystem(), seed=0)


def result(score: float, iteration: int) -> dict[str, Any]:
    return {"score": score, "training_iteration": iteration}


def test_pbt_bottom_trial_exploits_a_top_one_at_each_interval(tmp_path: Path) -> None:
    members = population(tmp_path)
    for name, lr in (("a", 0.1), ("b", 0.01), ("c", 0.001), ("d", 0.1)):
        members.add(name, {"lr": lr})
    for name, score in (("a", 4.0), ("b", 3.0), ("c", 2.0)):
        assert members.on_result(name, result(score, 1), has_checkpoint=True) is None
    assert members.on_result("d", result(1.0, 1), has_checkpoint=True) is None  # not yet
    exploit = members.on_result("d", result(1.0, 2), has_checkpoint=True)
    # 4 trials, quantile 0.25: d (the worst) takes a (the best), with a's lr moved one step.
    assert exploit is not None and exploit.donor == "a"
    assert exploit.donor_config == {"lr": 0.1} and exploit.config == {"lr": 0.01}
    assert (exploit.iteration, exploit.score, exploit.donor_score) == (2, 1.0, 4.0)
    assert members.on_result("d", result(1.0, 3), has_checkpoint=True) is None  # 3 - 2 < 2
    assert members.on_result("b", result(3.0, 2), has_checkpoint=True) is None  # not bottom


def test_pbt_min_mode_ended_trials_and_donors_without_a_checkpoint(tmp_path: Path) -> None:
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"lr": [0.1, 0.01]},
    )
    members = Population(pbt, "loss", "min", str(tmp_path), LocalFileSystem(), seed=0)
    for name in ("low", "high", "gone"):
        members.add(name, {"lr": 0.1})
    members.on_result("low", {"loss": 0.5, "training_iteration": 1}, has_checkpoint=False)
    members.on_result("gone", {"loss": 0.1, "training_iteration": 1}, has_checkpoint=True)
    members.remove("gone")  # ended: neither compared nor chosen
    assert members.on_result("high", {"loss": 9.0, "training_iteration": 1}, True) is None
    members.on_result("low", {"loss": 0.5, "training_iteration": 2}, has_checkpoint=True)
    exploit = members.on_result("high", {"loss": 9.0, "training_iteration": 2}, True)
    assert exploit is not None and exploit.donor == "low"  # the lower loss is the better


def test_pbt_missing_keys_are_sampled_and_decisions_written_as_rays(tmp_path: Path) -> None:
    members = population(tmp_path)
    config = members.add("a", {"other": 1})
    assert config["lr"] in (0.1, 0.01, 0.001) and config["other"] == 1
    members.add("b", {"lr": 0.001, "other": 2})
    members.on_result("a", result(5.0, 2), has_checkpoint=True)
    exploit = members.on_result("b", result(1.0, 2), has_checkpoint=True)
    assert exploit is not None
    members.exploited("b", exploit)
    line = ["b", "a", 2, 2, {"other": 1, "lr": config["lr"]}, exploit.config]
    assert json.loads((tmp_path / "pbt_global.txt").read_text()) == line
    assert json.loads((tmp_path / "pbt_policy_b.txt").read_text()) == line
    assert members.on_result("b", result(9.0, 4), True) is None  # now the better...
    again = members.on_result("a", result(0.5, 4), True)  # ...with the config it was given
    assert again is not None and (again.donor, again.donor_config) == ("b", exploit.config)
    members.exploited("a", again)  # a's history becomes b's, then this line
    history = [json.loads(x) for x in (tmp_path / "pbt_policy_a.txt").read_text().splitlines()]
    assert [(h[0], h[1], h[2]) for h in history] == [("b", "a", 2), ("a", "b", 4)]
    members.on_result("b", result(0.1, 6), True)
    members.on_result("a", result(9.0, 6), True)
    members.on_result("b", result(0.1, 8), True)
    b_again = members.on_result("b", result(0.1, 10), True)
    assert b_again is not None and b_again.donor == "a"
    members.exploited("b", b_again)  # b's own history is replaced by a's, as Ray's
    lines = (tmp_path / "pbt_policy_b.txt").read_text().splitlines()
    assert [json.loads(x)[2] for x in lines] == [2, 4, 10]


def test_pbt_a_trial_exploiting_a_donor_without_history_keeps_its_own(tmp_path: Path) -> None:
    members = population(tmp_path)
    members.add("a", {"lr": 0.1})
    members.add("b", {"lr": 0.01})
    for iteration in (2, 4):
        members.on_result("b", result(5.0, iteration), has_checkpoint=True)
        exploit = members.on_result("a", result(1.0, iteration), has_checkpoint=True)
        assert exploit is not None and exploit.donor == "b"
        members.exploited("a", exploit)
    lines = (tmp_path / "pbt_policy_a.txt").read_text().splitlines()
    assert [json.loads(x)[2] for x in lines] == [2, 4]  # b never exploited: a keeps its own


def test_pbt_require_attrs_fails_a_result_without_the_metric(tmp_path: Path) -> None:
    members = population(tmp_path)
    members.add("a", {"lr": 0.1})
    with pytest.raises(ConfigError, match="without \\['score'\\]"):
        members.on_result("a", {"training_iteration": 1}, has_checkpoint=True)
    lenient = population(tmp_path, require_attrs=False)
    lenient.add("a", {"lr": 0.1})
    assert lenient.on_result("a", {"training_iteration": 1}, has_checkpoint=True) is None


def test_pbt_explore_moves_or_resamples_as_ray_does() -> None:
    mutations = {
        "choice": [1, 10, 100],
        "lr": tune.uniform(0.0, 1.0),
        "layers": lambda: 7,
        "nested": {"momentum": [0.8, 0.9, 0.99]},
    }
    config = {"choice": 10, "lr": 0.5, "layers": 4, "nested": {"momentum": 0.8}, "fixed": "x"}
    seen: dict[str, set[Any]] = {"choice": set(), "lr": set(), "layers": set(), "momentum": set()}
    rng = random.Random(1)
    for _ in range(200):
        new = explore(config, mutations, 0.0, (1.2, 0.8), rng)
        assert new["fixed"] == "x"
        for key in ("choice", "lr", "layers"):
            seen[key].add(new[key])
        seen["momentum"].add(new["nested"]["momentum"])
    assert seen["choice"] == {1, 100}  # a neighbour
    assert seen["lr"] == {0.5 * 1.2, 0.5 * 0.8}
    assert seen["layers"] == {4, 3}  # an int times 1.2 or 0.8, kept an int: int(4.8), int(3.2)
    assert seen["momentum"] == {0.8, 0.9}  # clipped at the list's end
    resampled = explore(config, mutations, 1.0, (1.2, 0.8), rng)
    assert resampled["layers"] == 7 and 0.0 <= resampled["lr"] <= 1.0
    assert config["nested"] == {"momentum": 0.8}  # the donor's config is left as it was


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs hyperparam_mutations or custom_explore_fn"),
        ({"hyperparam_mutations": {"lr": 0.1}}, "must be a list, a domain"),
        ({"hyperparam_mutations": {"lr": tune.sample_from(lambda _: 1)}}, "sample_from"),
        ({"hyperparam_mutations": {"lr": [1]}, "quantile_fraction": 0.6}, "between 0 and 0.5"),
        ({"hyperparam_mutations": {"lr": [1]}, "perturbation_interval": 0}, "must be > 0"),
        ({"hyperparam_mutations": {"lr": [1]}, "synch": True}, "use synch=False"),
    ],
)
def test_pbt_refuses_what_ray_refuses(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PopulationBasedTraining(**kwargs)


def test_pbt_needs_a_metric_to_rank_trials() -> None:
    pbt = PopulationBasedTraining(hyperparam_mutations={"lr": [0.1, 0.01]})
    with pytest.raises(ConfigError, match="metric"):
        tune.TuneConfig(scheduler=pbt)
    assert tune.TuneConfig(scheduler=pbt, metric="loss", mode="min").metric == "loss"

"""predict-cifar's output on a worker with a run policy: a new file outside the folders the
pipeline keeps. Generated outputs (depths, kept folder names anywhere on the path, files and
errors files already there) are refused exactly when the rule says, and nothing is written."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from flows.places import PolicyError
from flows.predict_cifar import predict_cifar
from flows.predict_output import check_output
from flows.run_policy import POLICY_VARIABLE, RunPolicy, run_policy
from tasks.layout import KEPT_FOLDERS
from tasks.predict import errors_beside

FOLDERS = [*sorted(KEPT_FOLDERS), "predictions", "team-a", "2026-12-07", "runs.d", "Runs"]


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunPolicy:
    (tmp_path / "store").mkdir()
    file = tmp_path / "policy.toml"
    file.write_text(f'read = ["{tmp_path}"]\nwrite = ["{tmp_path / "store"}"]\n')
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    return run_policy()


@pytest.mark.parametrize("seed", range(5))
def test_generated_outputs_are_refused_exactly_where_they_could_harm(
    seed: int, policy: RunPolicy, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    store = tmp_path / "store"
    for case in range(40):
        folders = [rng.choice(FOLDERS) for _ in range(rng.randint(0, 4))]
        name = f"out-{seed}-{case}" + rng.choice([".csv", ".parquet", ".v2.csv", ""])
        output = store.joinpath(*folders, name)
        existing = rng.choice([None, "output", "errors"])
        if existing is not None:
            target = Path(errors_beside(str(output)) if existing == "errors" else output)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("another run's data")
        uri = rng.choice([str(output), f"file://{output}"])
        kept = KEPT_FOLDERS.intersection(folders)
        if kept or existing is not None:
            with pytest.raises(PolicyError) as caught:
                check_output(uri, policy)
            message = str(caught.value)
            if kept:
                assert "where the pipeline keeps its own data" in message
            else:
                assert "exists already, and predict-cifar never overwrites" in message
        else:
            check_output(uri, policy)
        if existing is not None:
            assert target.read_text() == "another run's data"
        assert not output.exists() or existing == "output"


def test_without_a_policy_an_output_is_the_users_to_overwrite(tmp_path: Path) -> None:
    output = tmp_path / "runs" / "mine.csv"
    output.parent.mkdir()
    output.write_text("old")
    check_output(str(output), RunPolicy())


def test_predict_cifar_refuses_an_existing_output_before_it_loads_a_model(
    policy: RunPolicy, tmp_path: Path
) -> None:
    victim = tmp_path / "store" / "runs" / "nightly" / "checkpoint_000003" / "model.pt"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"weights")
    images = tmp_path / "images"
    images.mkdir()
    with pytest.raises(PolicyError, match="folder named 'runs'"):
        predict_cifar.fn(input=str(images), output=str(victim))
    assert victim.read_bytes() == b"weights"

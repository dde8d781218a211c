"""The worker's run policy: which places, servers and models a run's parameters may name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.run_policy import (
    DEFAULT_MODEL_ALIASES,
    DEFAULT_REGISTERED_MODELS,
    POLICY_VARIABLE,
    PolicyError,
    RunPolicy,
    run_policy,
)

_MODEL_DEFAULTS = {
    "registered_models": DEFAULT_REGISTERED_MODELS,
    "model_aliases": DEFAULT_MODEL_ALIASES,
}

STACK_POLICY = """
read = ["https://", "s3://cifar/"]
write = ["s3://cifar/", "{root}"]
mlflow_tracking_uri = ["https://mlflow.example.org"]
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "store").mkdir()
    return tmp_path / "store"


@pytest.fixture
def policy(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> RunPolicy:
    file = tmp_path / "policy.toml"
    file.write_text(STACK_POLICY.format(root=root))
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    return run_policy()


def _refusal(policy: RunPolicy, **parameters: str) -> str:
    with pytest.raises(PolicyError) as caught:
        policy.confine(**parameters)
    return str(caught.value)


@pytest.mark.parametrize(
    "value",
    [
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "s3://cifar/inputs/cifar.tar.gz",
        "S3://cifar/data/raw/x",
    ],
)
def test_policy_allows_what_it_lists(policy: RunPolicy, value: str) -> None:
    policy.confine(data_url=value)


def test_policy_refuses_a_secret_file_naming_the_policy_and_the_fix(policy: RunPolicy) -> None:
    message = _refusal(policy, data_url="file:///proc/self/environ")
    assert message == (
        f"data_url 'file:///proc/self/environ' is not allowed by the run policy "
        f"({policy.source}): runs may read https://, s3://cifar/. Use a place under one of "
        "those, or an operator adds a prefix to `read` in that file on the worker."
    )


@pytest.mark.parametrize(
    "value",
    [
        "/run/secrets/s3_data_secret_key",
        "http://example.org/cifar.tar.gz",  # http is not https
        "s3://cifar-other/x",  # a bucket whose name starts like an allowed one
        "s3://mlflow/1/model.pkl",
        "simplecache::s3://cifar/x",  # chained: could wrap anything
        "s3://cifar/data/../../mlflow/x",
    ],
)
def test_policy_refuses_what_it_does_not_list(policy: RunPolicy, value: str) -> None:
    assert "data_url" in _refusal(policy, data_url=value)


def test_policy_places_written_are_confined_to_write_with_links_resolved(
    policy: RunPolicy, root: Path, tmp_path: Path
) -> None:
    policy.confine(storage_path=str(root / "runs"), output=f"file://{root}/predictions.csv")
    assert "`write`" in _refusal(policy, output=str(tmp_path / "elsewhere.csv"))
    assert "`write`" in _refusal(policy, storage_path=f"{root}/../elsewhere")
    (root / "escape").symlink_to(tmp_path)  # a link under the root pointing out of it
    assert "`write`" in _refusal(policy, output=str(root / "escape" / "x.csv"))
    assert "`read`" in _refusal(policy, input=str(root / "images"))  # read is not write


def test_policy_servers_are_the_workers_own_or_listed(policy: RunPolicy) -> None:
    policy.confine(mlflow_tracking_uri="http://mlflow:5000/")  # the worker's own
    policy.confine(mlflow_tracking_uri="https://mlflow.example.org")
    message = _refusal(policy, mlflow_tracking_uri="http://user:hunter2@elsewhere:5000")
    assert "'http://user:***@elsewhere:5000' is not allowed" in message
    assert "hunter2" not in message
    assert "runs may use http://mlflow:5000, https://mlflow.example.org" in message
    assert "`study_storage`" in _refusal(policy, study_storage="postgresql://x@elsewhere/db")
    assert "`dask_address`" in _refusal(policy, dask_address="tcp://elsewhere:8786")


def test_policy_left_out_parameters_are_the_workers_defaults(policy: RunPolicy) -> None:
    policy.confine(data_url=None, storage_path=None, mlflow_tracking_uri=None, dask_address=None)


@pytest.mark.parametrize(
    "value",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[::ffff:169.254.169.254]/",
        "http://2852039166/",  # 169.254.169.254 as one number
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://[fe80::1]/",
    ],
)
def test_policy_link_local_addresses_are_refused_even_without_a_policy(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(POLICY_VARIABLE, raising=False)
    message = _refusal(run_policy(), data_url=value)
    assert "link-local address" in message
    assert f"allow_link_local = true in a run policy file named by ${POLICY_VARIABLE}" in message


def test_policy_without_a_file_a_users_own_command_line_may_name_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(POLICY_VARIABLE, raising=False)
    run_policy().confine(
        data_url="http://127.0.0.1:8000/cifar.tar.gz",  # python -m http.server
        storage_path=str(tmp_path),
        mlflow_tracking_uri="http://elsewhere:5000",
        study_storage="sqlite:////tmp/optuna.db",
        dask_address="tcp://10.0.0.5:8786",
        input="file:///etc/hostname",
    )


def test_policy_allow_link_local_lets_a_listed_metadata_url_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "policy.toml"
    file.write_text('read = ["http://169.254.169.254/"]\nallow_link_local = true\n')
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    run_policy().confine(data_url="http://169.254.169.254/data.tar.gz")


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        (None, "cannot be read"),
        ("read = [", "cannot be read"),
        ('raed = ["https://"]\n', "unknown keys: raed"),
        ('read = "https://"\n', "`read` must be a list of strings"),
        ('allow_link_local = "yes"\n', "`allow_link_local` must be true or false"),
    ],
)
def test_policy_a_broken_file_stops_every_run_saying_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | None, phrase: str
) -> None:
    file = tmp_path / "policy.toml"
    if text is not None:
        file.write_text(text)
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    with pytest.raises(PolicyError, match=phrase) as caught:
        run_policy()
    assert str(file) in str(caught.value)
    assert "operator" in str(caught.value)


def test_policy_an_unknown_parameter_is_a_programming_error(policy: RunPolicy) -> None:
    with pytest.raises(KeyError):
        policy.confine(data_path=os.devnull)


@settings(derandomize=True, max_examples=200)
@given(
    name=st.text(max_size=40).filter(lambda n: n not in DEFAULT_REGISTERED_MODELS)
    | st.sampled_from(DEFAULT_REGISTERED_MODELS).map(lambda n: n.upper())
    | st.sampled_from(DEFAULT_REGISTERED_MODELS).map(lambda n: f"{n} ")
    | st.sampled_from(DEFAULT_REGISTERED_MODELS).map(lambda n: f"{n}-mine"),
    alias=st.text(max_size=20).filter(lambda a: a not in DEFAULT_MODEL_ALIASES),
)
def test_policy_models_and_aliases_are_the_pipelines_own_unless_listed(
    name: str, alias: str
) -> None:
    """A model someone else registered (whose pickle could run code) is never loaded or
    published to by a worker's run."""
    policy = RunPolicy(source="p.toml", read=(), write=(), servers={}, **_MODEL_DEFAULTS)
    for allowed in DEFAULT_REGISTERED_MODELS:
        policy.confine(registered_model_name=allowed, alias="champion")
    with pytest.raises(
        PolicyError, match=r"(?s)registered_model_name .* runs may use cifar10-classifier"
    ):
        policy.confine(registered_model_name=name)
    with pytest.raises(PolicyError, match=r"(?s)alias .* runs may use champion, challenger"):
        policy.confine(registered_model_name="cifar10-classifier", alias=alias)
    RunPolicy().confine(registered_model_name=name, alias=alias)  # a user's own command line


def test_policy_the_operator_lists_the_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "policy.toml"
    file.write_text('registered_models = ["team-a"]\nmodel_aliases = []\n')
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    policy = run_policy()
    policy.confine(registered_model_name="team-a")
    assert "add" in _refusal(policy, registered_model_name="cifar10-classifier")
    assert "runs may use none" in _refusal(policy, alias="champion")

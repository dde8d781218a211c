"""The run policy's cluster classes and arguments: allowlists, fuzzed over the ways in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dask.config
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cifar.errors import InvalidParameterError
from flows.clusters import allowed_dask_config
from flows.run_policy import (
    DEFAULT_CLUSTER_KWARGS as DEFAULT_KWARGS,
)
from flows.run_policy import (
    OWN_CLUSTER_KWARGS,
    POLICY_VARIABLE,
    PolicyError,
    RunPolicy,
    run_policy,
)

STACK_POLICY = Path(__file__).resolve().parents[2] / "docker" / "run-policy.toml"


def _config(cluster_class: str | None, policy: RunPolicy | None = None, **kwargs: Any) -> Any:
    return allowed_dask_config(None, cluster_class, kwargs, 60.0, policy or RunPolicy())


@pytest.mark.parametrize(
    "allowed",
    [
        "distributed.LocalCluster",
        "dask_jobqueue.SLURMCluster",
        "dask_jobqueue.slurm.SLURMCluster",
        "dask_kubernetes.operator.KubeCluster",
        "dask_cuda.LocalCUDACluster",
    ],
)
def test_clusters_the_default_allows_dask_and_its_cluster_managers(allowed: str) -> None:
    assert _config(allowed).cluster_class == allowed


@pytest.mark.parametrize(
    "refused", ["subprocess.Popen", "os.system", "dask_jobqueuex.Evil", "dask_cuda.Other"]
)
def test_clusters_anything_else_is_refused_naming_the_allowed_and_the_setting(
    refused: str,
) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        _config(refused)
    assert str(caught.value) == (
        f"dask_cluster_class {refused!r} is not allowed here; allowed: distributed.LocalCluster, "
        "dask_jobqueue.*, dask_kubernetes.*, dask_cuda.LocalCUDACluster. An operator allows "
        "another class by adding it to dask_cluster_classes in a run policy file named by "
        "$CIFAR_RUN_POLICY on the worker."
    )


def test_clusters_the_operator_sets_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "policy.toml"
    file.write_text('dask_cluster_classes = ["site_clusters.*", "distributed.LocalCluster"]\n')
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    policy = run_policy()
    chosen = _config("site_clusters.GpuCluster", policy)
    assert chosen.cluster_class == "site_clusters.GpuCluster"
    with pytest.raises(InvalidParameterError, match=re.escape("allowed: site_clusters.*, distri")):
        _config("dask_jobqueue.SLURMCluster", policy)


# Keyword arguments of Dask's, dask-jobqueue's, dask-kubernetes' and dask-cuda's clusters (and
# their Scheduler and Worker) that run code, set an environment or Dask's configuration, or
# change security: none may pass, at any depth or spelling.
CODE_KEYS = [
    "config",
    "env",
    "environ",
    "preload",
    "preload_argv",
    "preload_nanny",
    "plugins",
    "security",
    "scheduler_options",
    "scheduler_kwargs",
    "worker_options",
    "worker_class",
    "worker_cls",
    "scheduler_cls",
    "job_cls",
    "job_script_prologue",
    "job_directives_skip",
    "env_extra",
    "python",
    "shebang",
    "worker_command",
    "image",
    "resources",
    "spec",
    "workers",
    "scheduler",
    "asynchronous",
    "loop",
    "dashboard_address",
    "host",
    "protocol",
    "service_kwargs",
]
ALLOWED_BY_A_POLICY_FILE = RunPolicy(source="policy.toml", dask_cluster_kwargs=DEFAULT_KWARGS)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
ALLOWED_VALUES = {
    "int": st.integers(0, 64),
    "bool": st.booleans(),
    "str": st.text(st.characters(min_codepoint=32, blacklist_characters="\x7f"), max_size=20),
    "place": st.just("/scratch/dask"),
    "list[str]": st.lists(st.sampled_from(["--gpus-per-task=1", "--resources", "GPU=1"])),
}


@settings(derandomize=True, max_examples=300)
@given(
    key=st.sampled_from(CODE_KEYS)
    | st.text(max_size=20).filter(lambda k: k not in OWN_CLUSTER_KWARGS)
    | st.sampled_from(CODE_KEYS).map(lambda k: k.upper())
    | st.sampled_from(CODE_KEYS).map(lambda k: f" {k}")
    | st.sampled_from(CODE_KEYS).map(lambda k: k.replace("_", "-")),
    value=JSON,
    others=st.dictionaries(st.sampled_from(sorted(DEFAULT_KWARGS)), st.just(1), max_size=3),
    cluster_class=st.sampled_from([None, "distributed.LocalCluster", "dask_jobqueue.SLURMCluster"]),
    policy=st.sampled_from([RunPolicy(), ALLOWED_BY_A_POLICY_FILE]),
)
def test_clusters_any_argument_not_on_the_allowlist_is_refused_naming_it(
    key: str, value: Any, others: dict[str, Any], cluster_class: str | None, policy: RunPolicy
) -> None:
    kwargs = {**others, key: value}
    with pytest.raises(InvalidParameterError, match=re.escape(f"may not set {key!r}:")):
        allowed_dask_config(None, cluster_class, kwargs, 60.0, policy)


@settings(derandomize=True, max_examples=300)
@given(
    key=st.sampled_from(sorted(DEFAULT_KWARGS)),
    value=st.recursive(
        st.dictionaries(st.text(), JSON, min_size=1, max_size=3)
        | st.lists(JSON, min_size=1, max_size=3).filter(
            lambda v: not all(isinstance(i, str) for i in v)
        ),
        lambda inner: st.dictionaries(st.text(), inner, max_size=2),
        max_leaves=4,
    ),
)
def test_clusters_a_nested_value_never_passes_where_a_scalar_is_allowed(
    key: str, value: Any
) -> None:
    """Dask's configuration and an environment are dicts: no allowed argument takes one."""
    with pytest.raises(InvalidParameterError, match=re.escape(f"dask_cluster_kwargs[{key!r}]")):
        _config(None, ALLOWED_BY_A_POLICY_FILE, **{key: value})


@settings(derandomize=True, max_examples=200)
@given(
    key=st.sampled_from(["queue", "account", "walltime", "job_extra_directives"]),
    before=st.text(max_size=5),
    control=st.characters(max_codepoint=31) | st.just("\x7f"),
    after=st.text(max_size=5),
)
def test_clusters_a_string_with_a_control_character_is_refused(
    key: str, before: str, control: str, after: str
) -> None:
    """A new line in a #SBATCH directive would start a line of the job script's shell."""
    text = before + control + after
    value = [text] if key == "job_extra_directives" else text
    with pytest.raises(InvalidParameterError, match=r"control character|must be"):
        _config("dask_jobqueue.SLURMCluster", **{key: value})


@settings(derandomize=True, max_examples=200)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            key: ALLOWED_VALUES[kind.split("|")[-1]] for key, kind in OWN_CLUSTER_KWARGS.items()
        },
    )
)
def test_clusters_allowed_arguments_of_their_types_pass_unchanged(kwargs: dict[str, Any]) -> None:
    assert dict(_config("dask_jobqueue.SLURMCluster", **kwargs).cluster_kwargs) == kwargs


@pytest.mark.parametrize(
    ("key", "value"),
    [("n_workers", True), ("n_workers", "2"), ("n_workers", 2.5), ("processes", "yes")],
)
def test_clusters_a_value_of_another_type_is_refused_naming_the_type(key: str, value: Any) -> None:
    with pytest.raises(InvalidParameterError, match=re.escape(f"[{key!r}] must be ")):
        _config(None, **{key: value})


def test_clusters_the_sbatch_and_worker_option_lists_need_a_policy_that_lists_them() -> None:
    """Without a policy file (a user's own command line) SLURM's GPU options pass; a worker that
    runs others' runs allows them only where its policy says so."""
    kwargs = {"job_extra_directives": ["--export=ALL,LD_PRELOAD=/tmp/x.so"]}
    assert dict(_config("dask_jobqueue.SLURMCluster", **kwargs).cluster_kwargs) == kwargs
    with pytest.raises(InvalidParameterError, match="may not set 'job_extra_directives'"):
        _config("dask_jobqueue.SLURMCluster", ALLOWED_BY_A_POLICY_FILE, **kwargs)


def test_clusters_a_folder_argument_is_a_place_the_policy_confines(tmp_path: Path) -> None:
    policy = RunPolicy(source="p.toml", read=(), write=(str(tmp_path),))
    inside = str(tmp_path / "dask")
    assert _config(None, policy, local_directory=inside).cluster_kwargs["local_directory"] == inside
    with pytest.raises(PolicyError, match="local_directory"):
        _config(None, policy, local_directory="/etc/cron.d")


def test_clusters_the_operator_sets_the_arguments_and_their_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "policy.toml"
    file.write_text('[dask_cluster_kwargs]\nn_workers = "int"\n')
    monkeypatch.setenv(POLICY_VARIABLE, str(file))
    policy = run_policy()
    assert dict(_config(None, policy, n_workers=2).cluster_kwargs) == {"n_workers": 2}
    with pytest.raises(InvalidParameterError, match="may not set 'threads_per_worker'"):
        _config(None, policy, threads_per_worker=1)
    for table in ('n_workers = "callable"', "n_workers = 1", 'x = "int|dict"'):
        file.write_text(f"[dask_cluster_kwargs]\n{table}\n")
        with pytest.raises(PolicyError, match="`dask_cluster_kwargs` must be a table"):
            run_policy()


def test_clusters_the_stacks_policy_allows_no_cluster_and_no_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(POLICY_VARIABLE, str(STACK_POLICY))
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    policy = run_policy()
    with dask.config.set({"scheduler-address": None}):
        for cluster_class in ("distributed.LocalCluster", None):  # None: the default one
            with pytest.raises(PolicyError, match="allowed: none"):
                _config(cluster_class, policy)
    with dask.config.set({"scheduler-address": "tls://dask-scheduler:8786"}):
        assert _config(None, policy).cluster_class is None  # the stack's own scheduler
        with pytest.raises(InvalidParameterError, match="the run policy allows none"):
            _config(None, policy, n_workers=1)

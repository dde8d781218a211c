"""The clean environment the fresh_load gate loads a version in, built by real pip from a
version's declared requirements. Offline: pip is told to use no index (``PIP_NO_INDEX``), and
the one requirement installed is the pip that ``venv`` bundles, so a build takes seconds."""

from __future__ import annotations

import ensurepip
import itertools
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from mlops import model_env
from mlops.model_env import (
    ModelEnvironmentError,
    ModeSettingError,
    environment_variables,
    python_for,
)

BUNDLED_PIP = f"pip=={ensurepip.version()}"  # installed without an index
HERE = ".".join(map(str, sys.version_info[:3]))


@pytest.fixture(autouse=True)
def offline_envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "envs"
    monkeypatch.setenv(model_env.ENVS_VARIABLE, str(root))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv(model_env.MODE_VARIABLE, raising=False)
    return root


def _model(folder: Path, requirements: list[str], python: str = HERE) -> Path:
    """A model folder declaring ``requirements`` as MLflow writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "python_env.yaml").write_text(
        yaml.safe_dump({"python": python, "build_dependencies": ["pip"], "dependencies": []})
    )
    (folder / "requirements.txt").write_text("\n".join(["# declared", *requirements]) + "\n")
    return folder


def _imports(python: str, module: str) -> bool:
    """Whether ``python`` imports ``module``, run as the gate runs it (outside the checkout,
    with ``environment_variables()``)."""
    done = subprocess.run(
        [python, "-c", f"import {module}"],
        env=environment_variables(),
        cwd=Path(python).parent,
        capture_output=True,
    )
    return done.returncode == 0


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_model_env_holds_the_declared_requirements_and_nothing_of_this_installation(
    tmp_path: Path, offline_envs: Path
) -> None:
    python = python_for(_model(tmp_path / "model", [BUNDLED_PIP]))
    assert Path(python).is_relative_to(offline_envs) and Path(python).exists()
    assert _imports(python, "pip")
    for installed_here in ("numpy", "dask", "mlops", "cifar"):  # all importable in this process
        assert not _imports(python, installed_here), installed_here
    kept = Path(python).parent.parent
    (kept / "still-here").touch()
    assert python_for(_model(tmp_path / "again", [BUNDLED_PIP])) == python  # reused, not rebuilt
    assert (kept / "still-here").exists()


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_model_env_left_half_built_is_built_again(tmp_path: Path, offline_envs: Path) -> None:
    """A build killed before its last package leaves a folder without the ready mark: the next
    evaluation removes it and builds again."""
    model = _model(tmp_path / "model", [BUNDLED_PIP])
    folder = offline_envs / model_env.declared(model).digest
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("#!/bin/sh\nexit 3\n")  # a broken interpreter
    python = python_for(model)
    assert Path(python) == folder / "bin" / "python"
    assert _imports(python, "pip")


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_model_env_two_evaluations_at_once_build_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []
    build = model_env._build

    def counted(folder: Path, wanted: model_env.Declared) -> None:
        builds.append(folder)
        build(folder, wanted)

    monkeypatch.setattr(model_env, "_build", counted)
    model = _model(tmp_path / "model", [BUNDLED_PIP])
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(python_for(model))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(found) == 2 and found[0] == found[1]


def _not_pins() -> list[str]:
    """Requirements pip would install but that are not ``name==version``: generated from
    operators, URLs, markers and pip's own options."""
    operators = [">=", "<=", "~=", "!=", ">", "<", "===", "=="]
    versions = ["1.0", "1.*", "1.0,<2", ""]
    made = {f"torch{op}{v}" for op, v in itertools.product(operators, versions)} - {"torch==1.0"}
    made |= {
        "torch",
        "torch[cuda]",
        "torch==1.0; python_version > '3'",
        "torch @ https://example.com/torch-1.0-py3-none-any.whl",
        "git+https://example.com/torch.git",
        "https://example.com/torch-1.0.tar.gz",
        "--index-url https://example.com/simple",
        "--extra-index-url=https://example.com/simple torch==1.0",
        "-i https://example.com/simple",
        "-e .",
        "-r other.txt",
        "-c constraints.txt",
        "./local-package",
        "/abs/local.whl",
        "torch==1.0 --hash=sha256:00",
    }
    return sorted(made)


@pytest.mark.parametrize("requirement", _not_pins())
def test_model_env_refuses_a_requirement_that_is_not_a_pin_before_pip_runs(
    tmp_path: Path, offline_envs: Path, requirement: str
) -> None:
    model = _model(tmp_path / "model", [BUNDLED_PIP, requirement])
    with pytest.raises(ModelEnvironmentError, match="name==version") as raised:
        python_for(model)
    assert requirement.split()[0] in str(raised.value)
    assert not offline_envs.exists()  # nothing built, nothing installed


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_model_env_a_pin_pip_cannot_install_fails_naming_pips_error(
    tmp_path: Path, offline_envs: Path
) -> None:
    model = _model(tmp_path / "model", [BUNDLED_PIP, "no-such-package-for-trainlib==1.0"])
    with pytest.raises(ModelEnvironmentError, match="pip could not install") as raised:
        python_for(model)
    assert "no-such-package-for-trainlib" in str(raised.value)
    assert "ERROR" in str(raised.value)
    assert not (offline_envs / model_env.declared(model).digest).exists()  # nothing half-kept


def test_model_env_another_python_release_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelEnvironmentError, match=r"declares Python 3\.1\.0.*Python 3\.1 runs"):
        python_for(_model(tmp_path / "model", [BUNDLED_PIP], python="3.1.0"))


def test_model_env_without_declared_files_says_how_to_register(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    with pytest.raises(ModelEnvironmentError, match="pip_requirements"):
        python_for(tmp_path / "bare")


def test_model_env_a_folder_it_cannot_write_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(model_env.ENVS_VARIABLE, str(tmp_path / "a-file" / "envs"))
    with pytest.raises(ModelEnvironmentError, match=f"set {model_env.ENVS_VARIABLE}"):
        python_for(_model(tmp_path / "model", [BUNDLED_PIP]))


@pytest.mark.parametrize("value", ["venv", "Clean", "none", "1"])
def test_model_env_a_mode_it_does_not_know_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(model_env.MODE_VARIABLE, value)
    with pytest.raises(ModeSettingError, match=r"'clean'.*'installed'"):
        python_for(_model(tmp_path / "model", [BUNDLED_PIP]))


def test_model_env_installed_mode_checks_the_declared_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline_envs: Path
) -> None:
    import importlib.metadata

    monkeypatch.setenv(model_env.MODE_VARIABLE, "installed")
    numpy = f"numpy=={importlib.metadata.version('numpy')}"
    assert python_for(_model(tmp_path / "same", [numpy])) == sys.executable
    with pytest.raises(ModelEnvironmentError, match=r"numpy==0\.1 \(installed: \d"):
        python_for(_model(tmp_path / "other", ["numpy==0.1"]))
    with pytest.raises(ModelEnvironmentError, match=r"\(installed: none\)"):
        python_for(_model(tmp_path / "absent", ["no-such-package-for-trainlib==1.0"]))
    assert not offline_envs.exists()

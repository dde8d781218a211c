"""The Python environment the release gate ``fresh_load`` loads a version in: by default a
clean virtual environment built from the version's declared requirements (the
``requirements.txt`` MLflow logged with it) and nothing else, so a version that imports what it
never declared, or needs another release of what it did, fails the gate here, not in the
service that loads it.

Environments are kept, one per set of requirements and Python release, under
``CIFAR_MODEL_ENVS`` (default ``~/.cache/dask-train-cifar/model-envs``): the first version
with a new set builds one (pip, from the indexes pip is configured with; about 2.5 minutes and
6 GB with torch), later ones reuse it. A build holds a file lock, so two evaluations build it
once, and the environment counts only once its last package is in: one killed half way is
built again. Every requirement must be pinned (``name==version``) and is installed from wheels
only, so installing runs no code of the version's choosing. The folder may be removed at any
time.

``CIFAR_FRESH_LOAD_ENV=installed`` (an image built for serving, with no package index at run
time, as the compose stack's worker) loads the version in a new process of this installation
instead, after checking that every declared requirement is installed at the declared release.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from cifar.errors import PipelineError

ENVS_VARIABLE = "CIFAR_MODEL_ENVS"
MODE_VARIABLE = "CIFAR_FRESH_LOAD_ENV"
CLEAN, INSTALLED = "clean", "installed"
BUILD_TIMEOUT_S = 1800.0
_READY = ".requirements-installed"  # written last: its absence means a build that did not end
# What a process run in the environment must not inherit from this one.
_INHERITED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")


class ModelEnvironmentError(PipelineError):
    """The version's declared environment cannot be had here: a requirement that is not a
    pin, another Python release, or packages pip cannot install."""


class ModeSettingError(PipelineError, ValueError):
    """``CIFAR_FRESH_LOAD_ENV`` names no mode."""


@dataclass(frozen=True)
class Declared:
    """What a version declares it needs: its Python release and its pinned requirements."""

    python: str
    requirements: tuple[str, ...]

    @property
    def digest(self) -> str:
        """The environment's key: this Python's release (it builds the environment) and the
        requirements, in a canonical order."""
        text = "\n".join([platform.python_version(), *sorted(self.requirements)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def mode() -> str:
    """``clean`` or ``installed``, from ``CIFAR_FRESH_LOAD_ENV`` (module doc).

    Raises:
        ModeSettingError: Another value.
    """
    value = os.environ.get(MODE_VARIABLE, "").strip() or CLEAN
    if value not in (CLEAN, INSTALLED):
        raise ModeSettingError(
            f"{MODE_VARIABLE}={value!r} names no mode: set it to {CLEAN!r} (a virtual "
            f"environment built from the version's requirements, the default) or "
            f"{INSTALLED!r} (this installation, its releases checked against them)."
        )
    return value


def declared(model_dir: Path) -> Declared:
    """The Python release and requirements of the MLflow model in ``model_dir`` (its
    ``python_env.yaml`` and ``requirements.txt``).

    Raises:
        ModelEnvironmentError: A file is missing, or a requirement is not ``name==version``.
    """
    try:
        python_env = yaml.safe_load((model_dir / "python_env.yaml").read_text())
        lines = (model_dir / "requirements.txt").read_text().splitlines()
    except (OSError, yaml.YAMLError) as error:
        raise ModelEnvironmentError(
            f"the model declares no environment MLflow can read ({error}); register it with "
            "its requirements (mlflow's pip_requirements)."
        ) from error
    requirements = tuple(_pinned(line) for line in lines if line.split("#")[0].strip())
    return Declared(str(python_env.get("python", "")), requirements)


def _pinned(line: str) -> str:
    """``line`` as ``name==version``, or why it cannot be installed as declared."""
    text = line.split("#")[0].strip()
    try:
        requirement = Requirement(text)
    except InvalidRequirement as error:
        raise ModelEnvironmentError(
            f"the requirement {text!r} is not a package pin (pip options, paths and URLs are "
            f"not installed: {error}); declare every requirement as name==version."
        ) from None
    pins = list(requirement.specifier)
    exact = len(pins) == 1 and pins[0].operator == "==" and "*" not in pins[0].version
    if requirement.url or requirement.marker or not exact:
        raise ModelEnvironmentError(
            f"the requirement {text!r} is not pinned: the environment a version is judged in "
            "must be the one it declares; declare it as name==version."
        )
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}=={pins[0].version}"


def python_for(model_dir: Path) -> str:
    """The interpreter to load the model in ``model_dir`` with: in mode ``clean`` that of its
    environment, built if none is kept yet; in mode ``installed``, this one (module doc).

    Raises:
        ModelEnvironmentError: The environment cannot be had (``declared``; another Python
            release; pip failed, with its last lines) or, in mode ``installed``, a declared
            release is not the installed one.
    """
    wanted = declared(model_dir)
    if mode() == INSTALLED:
        _check_installed(wanted)
        return sys.executable
    here = ".".join(map(str, sys.version_info[:2]))
    if wanted.python and ".".join(wanted.python.split(".")[:2]) != here:
        raise ModelEnvironmentError(
            f"the model declares Python {wanted.python} and this host runs Python {here}: "
            f"evaluate it where Python {wanted.python.rsplit('.', 1)[0]} runs."
        )
    return str(_environment(wanted) / "bin" / "python")


def environment_variables() -> dict[str, str]:
    """This process's variables less what would let a process in the environment see this
    installation's packages (``PYTHONPATH`` and the like, the user's site-packages)."""
    kept = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    return {**kept, "PYTHONNOUSERSITE": "1"}


def _check_installed(wanted: Declared) -> None:
    differ = []
    for pin in wanted.requirements:
        name, release = pin.split("==")
        try:
            have = importlib.metadata.version(name.split("[")[0]).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            have = "none"
        if have != release:
            differ.append(f"{pin} (installed: {have})")
    if differ:
        raise ModelEnvironmentError(
            f"the model declares {', '.join(differ)}: this installation is not its "
            f"environment. Install those releases, or unset {MODE_VARIABLE} to build one."
        )


def _root() -> Path:
    configured = os.environ.get(ENVS_VARIABLE, "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "dask-train-cifar" / "model-envs"


def _environment(wanted: Declared) -> Path:
    """The kept environment for ``wanted``, built under a file lock if it is not yet."""
    root = _root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        folder = root / wanted.digest
        with open(root / f"{wanted.digest}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second evaluation waits for the first build
            if not (folder / _READY).exists():
                _build(folder, wanted)
    except OSError as error:
        raise ModelEnvironmentError(
            f"the model's environment cannot be kept in {root} ({error}); set "
            f"{ENVS_VARIABLE} to a folder this process may write."
        ) from error
    return folder


def _build(folder: Path, wanted: Declared) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # what a killed build left
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    requirements = folder / "requirements.txt"
    requirements.write_text("\n".join(wanted.requirements) + "\n")
    command = [str(folder / "bin" / "python"), "-m", "pip", "install", "--no-input"]
    command += ["--disable-pip-version-check", "--only-binary=:all:", "-r", str(requirements)]
    try:
        done = subprocess.run(
            command,
            env=environment_variables(),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(folder, ignore_errors=True)
        raise ModelEnvironmentError(
            f"installing the model's requirements took over {BUILD_TIMEOUT_S:.0f} s; check "
            "that pip reaches its package index from this host."
        ) from None
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        last = " | ".join((errors or done.stderr.strip().splitlines())[-3:])
        raise ModelEnvironmentError(
            f"pip could not install the model's requirements ({', '.join(wanted.requirements)})"
            f": {last}"
        )
    (folder / _READY).write_text(requirements.read_text())


def prepare(requirements: tuple[str, ...]) -> Path:
    """The environment for ``requirements`` (pins) on this Python, built now if none is kept:
    ``python -m mlops.model_env`` prepares the one the pipeline's own versions declare, so the
    first evaluation does not wait for it."""
    return _environment(
        Declared(platform.python_version(), tuple(_pinned(pin) for pin in requirements))
    )


if __name__ == "__main__":
    from mlops.registry import REQUIREMENTS

    print(prepare(REQUIREMENTS))

"""Weights & Biases, as Ray's ``ray.air.integrations.wandb``: ``WandbLoggerCallback`` for a
Tuner's ``RunConfig(callbacks=)`` and ``setup_wandb`` in a training function.

``WandbLoggerCallback`` makes one W&B run per trial (its id the trial's, its name the trial's,
its group the experiment's), in the trial's folder: the config, each result's numbers
(flattened ``a/b``; Ray's ``trial_id``, ``date``, ... go to the run's config), its checkpoints
as artifacts with ``upload_checkpoints``, and its end (exit code 1 for a failed trial). A
tracker never stops training: a W&B call that fails is logged once for the trial and its W&B
logging ends there. ``setup_wandb`` starts a run for the trial (or the run) in rank 0, and a
disabled run elsewhere (``rank_zero_only``). W&B is an optional dependency (``pip install
".[wandb]"``), imported on use; ``WANDB_MODE=offline`` keeps everything local.
"""

from __future__ import annotations

import logging
import os
from numbers import Number
from typing import Any

from trainlib.tune.callback import Trial
from trainlib.tune.logger import LoggerCallback, flatten

logger = logging.getLogger(__name__)

WANDB_ENV_VAR = "WANDB_API_KEY"
WANDB_PROJECT_ENV_VAR = "WANDB_PROJECT_NAME"
WANDB_GROUP_ENV_VAR = "WANDB_GROUP_NAME"
_EXCLUDED = ("done", "should_checkpoint")  # never logged
_TO_CONFIG = ("trial_id", "experiment_tag", "node_ip", "experiment_id", "hostname", "pid", "date")


def setup_wandb(
    config: dict[str, Any] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: Any,
) -> Any:
    """A W&B run for this training function (Ray's ``setup_wandb``): its id and name the
    trial's, its group the experiment's, ``config`` its config; ``kwargs`` go to
    ``wandb.init`` and win. With ``rank_zero_only``, ranks other than 0 get a disabled run
    (its calls do nothing), so a group logs once."""
    import wandb

    from trainlib.context import get_context
    from trainlib.tune.context import get_context as get_trial_context

    defaults: dict[str, Any] = {}
    try:
        rank = get_context().get_world_rank()
    except RuntimeError:  # outside a training function
        rank = 0
    else:
        trial = get_trial_context()
        defaults = {
            "id": trial.get_trial_id(),
            "name": trial.get_trial_name(),
            "group": os.environ.get(WANDB_GROUP_ENV_VAR) or trial.get_experiment_name(),
        }
    if rank_zero_only and rank != 0:
        return wandb.init(mode="disabled")
    _set_api_key(api_key_file, api_key)
    options = {
        **{k: v for k, v in defaults.items() if v},
        "project": _project(None),
        "resume": "allow",
        "reinit": "create_new",
        "allow_val_change": True,
        "config": _clean(config or {}),
        **kwargs,
    }
    return wandb.init(**options)


class WandbLoggerCallback(LoggerCallback):
    """Logs each trial of a search to its own W&B run (Ray's ``WandbLoggerCallback``).

    Args:
        project: The W&B project (else ``WANDB_PROJECT_NAME``); required.
        group: The runs' group (else ``WANDB_GROUP_NAME``, else the experiment's name).
        api_key_file, api_key: W&B's API key, or a file holding it (else ``WANDB_API_KEY`` or
            ``wandb login``'s); never both.
        excludes: Results not to log (a name covers its nested keys).
        log_config: Log each result's ``config`` too (PBT changes it).
        upload_checkpoints: Log each committed checkpoint as a ``model`` artifact
            (``save_checkpoints`` is Ray's older name).
        upload_timeout: Ray's; W&B uploads when the run finishes.
        **kwargs: Passed to ``wandb.init``.
    """

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        save_checkpoints: bool = False,
        upload_timeout: int = 1800,
        **kwargs: Any,
    ) -> None:
        self.project = project
        self.group = group
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints or save_checkpoints
        self.upload_timeout = upload_timeout
        self.kwargs = kwargs
        self._runs: dict[Trial, Any] = {}

    def setup(self, *args: Any, **kwargs: Any) -> None:
        _set_api_key(self.api_key_file, self.api_key)
        self.project = _project(self.project)
        if not self.project:
            raise ValueError(
                "WandbLoggerCallback needs a project: pass project=... or set "
                f"{WANDB_PROJECT_ENV_VAR}."
            )
        self.group = self.group or os.environ.get(WANDB_GROUP_ENV_VAR)

    def log_trial_start(self, trial: Trial) -> None:
        import wandb

        if self.project is None:  # setup() was not called (a callback used on its own)
            self.setup()
        experiment = os.path.basename(os.path.dirname(trial.path.rstrip("/")))
        options = {
            "id": trial.trial_id,
            "name": str(trial),
            "group": self.group or experiment,
            "project": self.project,
            "config": _clean({k: v for k, v in trial.config.items() if k != "callbacks"}),
            "dir": trial.local_path or None,
            "resume": "allow",  # a resumed trial goes on in the same run
            "reinit": "create_new",  # trials run at once: one run each
            "allow_val_change": True,
            **self.kwargs,
        }
        self._guarded(trial, lambda: self._runs.__setitem__(trial, wandb.init(**options)))

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial not in self._runs:
            self.log_trial_start(trial)
        run = self._runs.get(trial)
        if run is None:
            return
        log, config = self._split(result)
        self._guarded(
            trial, lambda: (run.config.update(config, allow_val_change=True), run.log(log))
        )

    def on_checkpoint(
        self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any
    ) -> None:
        run = self._runs.get(trial)
        if not self.upload_checkpoints or run is None:
            return

        def upload() -> None:
            import wandb

            artifact = wandb.Artifact(name=f"checkpoint_{trial}", type="model")
            with checkpoint.as_directory() as directory:
                artifact.add_dir(directory)
                run.log_artifact(artifact).wait()

        self._guarded(trial, upload)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        run = self._runs.pop(trial, None)
        if run is not None:
            self._guarded(trial, lambda: run.finish(exit_code=1 if failed else 0))

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for trial in list(self._runs):  # a search cut short: every run still open ends
            self.log_trial_end(trial, failed=True)

    def _split(self, result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """What of a result is logged, and what updates the run's config."""
        excluded = [*_EXCLUDED, *self.excludes, *([] if self.log_config else ["config"])]
        log: dict[str, Any] = {}
        config: dict[str, Any] = {}
        for key, value in flatten(result).items():
            if _under(key, _TO_CONFIG):
                config[key] = value
            elif not _under(key, excluded) and _loggable(value):
                log[key] = value.item() if hasattr(value, "item") else value
        return log, config

    def _guarded(self, trial: Trial, call: Any) -> None:
        try:
            call()
        except Exception as exc:  # a tracker never stops training
            logger.warning("W&B logging of trial %s stopped: %r", trial, exc)
            self._runs.pop(trial, None)


def _set_api_key(api_key_file: str | None, api_key: str | None) -> None:
    if api_key_file and api_key:
        raise ValueError("Both WandB `api_key_file` and `api_key` set: give one.")
    if api_key_file:
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ[WANDB_ENV_VAR] = api_key  # where wandb reads it; never logged


def _project(project: str | None) -> str | None:
    return project or os.environ.get(WANDB_PROJECT_ENV_VAR)


def _under(key: str, names: Any) -> bool:
    return any(key == name or key.startswith(f"{name}/") for name in names)


def _loggable(value: Any) -> bool:
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        value = value.item()
    return isinstance(value, Number) and not isinstance(value, bool)


def _clean(config: dict[str, Any]) -> dict[str, Any]:
    """A config W&B can store: what JSON cannot hold as text."""
    import json

    clean: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            clean[key] = _clean(value)
            continue
        try:
            json.dumps(value)
            clean[key] = value
        except (TypeError, ValueError):
            clean[key] = str(value)
    return clean

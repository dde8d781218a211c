"""PBT's running search (``Population``): every trial's config and last score, who exploits whom
and when (``Exploit``), the explored config, and Ray's decision logs
(``schedulers/pbt.py`` says the rules)."""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.schedulers import pbt_log
from trainlib.tune.schedulers.mutations import explore, fill
from trainlib.tune.schedulers.pbt import PopulationBasedTraining

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from trainlib._internal.common.storage import RunStorage


logger = logging.getLogger("trainlib.tune.schedulers.pbt")  # PBT's decisions, under one name


@dataclass(frozen=True)
class Exploit:
    """A decision: the trial takes ``donor``'s latest checkpoint and ``config``."""

    donor: str
    config: dict[str, Any]
    donor_config: dict[str, Any]
    iteration: int  # the exploiting trial's training_iteration
    donor_iteration: int
    score: float
    donor_score: float


@dataclass
class _Member:
    config: dict[str, Any]
    running: bool = True
    last_score: float | None = None  # larger is better (the metric, negated for "min")
    last_perturbation_time: float = 0.0
    iteration: int = 0
    has_checkpoint: bool = False


@dataclass
class Population:
    """The running search's trials as PBT sees them; every method may be called from any
    trial's thread."""

    scheduler: PopulationBasedTraining
    metric: str
    mode: str
    log_dir: str
    filesystem: AbstractFileSystem
    seed: int | None = None
    _members: dict[str, _Member] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @classmethod
    def of(
        cls,
        scheduler: Any,
        metric: str | None,
        mode: str | None,
        seed: int | None,
        experiment: RunStorage,
    ) -> Population | None:
        """PBT's view of a search's trials (its TuneConfig's ``scheduler``, ``metric``,
        ``mode`` and ``seed``; its directory ``experiment``), if its scheduler is PBT."""
        if not isinstance(scheduler, PopulationBasedTraining):
            return None
        assert metric is not None and mode is not None  # TuneConfig checked
        return cls(scheduler, metric, mode, experiment.run_dir, experiment.filesystem, seed=seed)

    def add(self, trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
        """A trial starts: its config, with the mutated keys it lacks sampled (as Ray's)."""
        config = copy.deepcopy(config)
        with self._lock:
            fill(config, self.scheduler.hyperparam_mutations or {}, self._rng)
            self._members[trial_id] = _Member(config)
        return config

    def remove(self, trial_id: str) -> None:
        """A trial ended: it is no longer compared nor chosen as a donor."""
        with self._lock:
            if trial_id in self._members:
                self._members[trial_id].running = False

    def on_result(
        self, trial_id: str, result: Mapping[str, Any], has_checkpoint: bool
    ) -> Exploit | None:
        """Record a result; the exploit to carry out now, if the trial should.

        Raises:
            ConfigError: The result lacks ``time_attr`` or the metric and ``require_attrs``.
        """
        pbt = self.scheduler
        missing = [key for key in (pbt.time_attr, self.metric) if key not in result]
        if missing:
            message = (
                f"PopulationBasedTraining: trial {trial_id} reported {sorted(result)} without "
                f"{missing}; report them, or pass require_attrs=False to skip such results."
            )
            if pbt.require_attrs:
                raise ConfigError(message)
            if message not in self._warned:
                self._warned.add(message)
                logger.warning(message)
            return None
        sign = 1.0 if self.mode == "max" else -1.0
        with self._lock:
            member = self._members[trial_id]
            member.last_score = sign * float(result[self.metric])
            member.iteration = int(result.get("training_iteration", member.iteration))
            member.has_checkpoint = member.has_checkpoint or has_checkpoint
            time = float(result[pbt.time_attr])
            if time - member.last_perturbation_time < pbt.perturbation_interval:
                return None
            if time < pbt.burn_in_period:
                return None
            member.last_perturbation_time = time
            lower, upper = self._quantiles()
            if trial_id not in lower:
                return None
            donor_id = self._rng.choice(upper)
            donor = self._members[donor_id]
            if not donor.has_checkpoint:
                logger.info(
                    "[pbt] trial %s has no checkpoint yet: trial %s does not exploit it",
                    donor_id,
                    trial_id,
                )
                return None
            assert donor.last_score is not None  # in the top group: it has a result
            return Exploit(
                donor=donor_id,
                config=self._explore(donor.config),
                donor_config=copy.deepcopy(donor.config),
                iteration=member.iteration,
                donor_iteration=donor.iteration,
                score=sign * member.last_score,
                donor_score=sign * donor.last_score,
            )

    def exploited(self, trial_id: str, exploit: Exploit) -> None:
        """The trial took the donor's checkpoint: it runs with the new config from now on."""
        with self._lock:
            self._members[trial_id].config = copy.deepcopy(exploit.config)
            self._members[trial_id].has_checkpoint = True
        logger.info(
            "[exploit] transferring weights from trial %s (score %s) -> %s (score %s)",
            exploit.donor,
            exploit.donor_score,
            trial_id,
            exploit.score,
        )
        logger.info(
            "[explore] perturbed config of trial %s from %s -> %s",
            trial_id,
            exploit.donor_config,
            exploit.config,
        )
        if self.scheduler.log_config:
            self._write_policy(trial_id, exploit)

    def _quantiles(self) -> tuple[list[str], list[str]]:
        """The running trials with a result: the bottom and top groups (empty if fewer
        than two)."""
        ranked = sorted(
            (t for t, m in self._members.items() if m.running and m.last_score is not None),
            key=lambda t: self._members[t].last_score or 0.0,
        )
        if len(ranked) <= 1:
            return [], []
        size = math.ceil(len(ranked) * self.scheduler.quantile_fraction)
        size = min(size, len(ranked) // 2)
        if size == 0:
            return [], []
        return ranked[:size], ranked[-size:]

    def _explore(self, config: dict[str, Any]) -> dict[str, Any]:
        pbt = self.scheduler
        new = explore(
            config,
            pbt.hyperparam_mutations or {},
            pbt.resample_probability,
            pbt.perturbation_factors,
            self._rng,
        )
        if pbt.custom_explore_fn is not None:
            new = pbt.custom_explore_fn(new)
            if new is None:
                raise ConfigError(
                    "PopulationBasedTraining(custom_explore_fn=...) returned None: return the "
                    "config to use."
                )
        return new

    def _write_policy(self, trial_id: str, exploit: Exploit) -> None:
        """Ray's records: one line in the search's log; the trial's history becomes the
        donor's (if it has one; else it keeps its own), with this line."""
        line = json.dumps(
            [
                trial_id,
                exploit.donor,
                exploit.iteration,
                exploit.donor_iteration,
                exploit.donor_config,
                exploit.config,
            ],
            default=str,
        )
        with self._lock:
            pbt_log.record(self.filesystem, self.log_dir, trial_id, exploit.donor, line)

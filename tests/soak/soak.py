"""A compressed month of nights under injected faults (``make soak``; CI runs a short one).

Night by night, as the scheduler would, a ``train-cifar/nightly`` run is created (every fifth
night a ``train-cifar/manual`` run starts with it) on the rig's real services (``tests.soak.rig``)
with a tiny model; one fault (``tests.soak.faults``), drawn with the night's phase from a seeded
generator, strikes when that phase begins. After every night the checks of ``tests.soak.checks``
run; a last night without a fault must complete. The table: night, fault, phase, outcome,
seconds from the fault to its detection (an alert, or the run Crashed) and to the recovery (the
next Completed nightly).
"""

from __future__ import annotations

import contextvars
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.helpers import rank_processes
from tests.soak import checks
from tests.soak.faults import FAULTS, Fault, NotInjected, can_fill_disk
from tests.soak.rig import MODEL, Bounds, Rig, soak_rig


@dataclass
class Night:
    """One night's record (a row of the table)."""

    number: int
    fault: str
    phase: str
    detail: str = ""
    outcomes: dict[str, str] = field(default_factory=dict)  # deployment -> final state
    injected_at: float | None = None
    injected: bool | None = None  # None: no fault that night; False: it found nothing to strike
    detected_s: float | None = None
    recovered_s: float | None = None
    seconds: float = 0.0
    ended_at: float = 0.0
    problems: list[str] = field(default_factory=list)
    storage_mb: tuple[float, float] = (0.0, 0.0)


@dataclass
class Soak:
    nights: list[Night]
    bounds: Bounds
    overlaps: list[str]
    trainings: int

    @property
    def problems(self) -> list[str]:
        found = [f"night {n.number}: {p}" for n in self.nights for p in n.problems]
        return found + [f"trainings overlapped: {o}" for o in self.overlaps]

    def table(self) -> str:
        rows = [
            "| night | fault | phase | outcome | detected (s) | recovered (s) | night (s) | "
            "S3 / database (MB) |",
            "|---:|---|---|---|---:|---:|---:|---:|",
        ]
        for n in self.nights:
            outcome = ", ".join(f"{d} {s}" for d, s in n.outcomes.items())
            rows.append(
                f"| {n.number} | {n.fault} | {n.phase} | {outcome} | {_s(n.detected_s)} | "
                f"{_s(n.recovered_s)} | {n.seconds:.0f} | {n.storage_mb[0]:.0f} / "
                f"{n.storage_mb[1]:.0f} |"
            )
        return "\n".join(rows)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def pairs(disk: bool) -> list[tuple[str, str]]:
    """Every (fault, phase) the soak can inject (the disk fault only where it can fill one)."""
    names = [n for n, f in FAULTS.items() if disk or not f.needs_root]
    return [(name, phase) for name in names for phase in FAULTS[name].phases]


def plan(nights: int, seed: int, faults: list[str] | None, disk: bool) -> list[tuple[str, str]]:
    """(fault, phase) for each night: ``faults`` in order if given (each at a drawn phase);
    else every pair of ``pairs(disk)`` once, in a seeded random order, then again in another,
    so ``len(pairs(disk))`` nights hit each fault at each of its phases."""
    rng = random.Random(seed)
    if faults:
        chosen = [faults[i % len(faults)] for i in range(nights)]
        return [(name, rng.choice(FAULTS[name].phases)) for name in chosen]
    schedule: list[tuple[str, str]] = []
    while len(schedule) < nights:
        every = pairs(disk)
        rng.shuffle(every)
        schedule += every
    return schedule[:nights]


def run_soak(
    root: Path,
    nights: int | None,
    seed: int,
    faults: list[str] | None = None,
    bounds: Bounds | None = None,
    log: Any = print,
) -> Soak:
    """The soak: ``nights`` faulty nights (None: one per fault and phase, ``pairs``) and a
    last clean one, on a fresh rig in ``root``."""
    bounds = bounds or Bounds()
    disk = can_fill_disk(root)
    nights = len(pairs(disk)) if nights is None else nights
    schedule = plan(nights, seed, faults, disk)
    log(f"Soak: {nights} nights, seed {seed}; shortened for the soak: {bounds.shortened()}")
    if missed := sorted(set(pairs(disk)) - set(schedule)):
        log(f"Not injected in these {nights} nights: {', '.join(f'{f} at {p}' for f, p in missed)}")
    with (
        soak_rig(root, bounds, small_disk=disk) as rig,
        temporary_settings({PREFECT_API_URL: rig.env["PREFECT_API_URL"]}),
    ):
        watch = checks.OverlapWatch(rig.dask.address)
        watch.start()
        records: list[Night] = []
        try:
            _nights(rig, schedule, seed, records, log)
        finally:
            watch.stop()
        if records[-1].outcomes.get("nightly") != "Completed":
            records[-1].problems.append("the last, fault-free night did not complete")
    return Soak(records, bounds, watch.overlaps, len(watch.trainings))


def _nights(
    rig: Rig, schedule: list[tuple[str, str]], seed: int, records: list[Night], log: Any
) -> None:
    """Each night of the schedule, then a last one without a fault, into ``records``."""
    champion_checked: str | None = None
    ended: list[FlowRun] = []  # every run so far, as it ended
    # (place in the schedule, fault, phase): every fifth place also starts a manual run
    queue = list(enumerate([*schedule, ("none", "-")], start=1))
    number = 0
    while queue:
        place, (fault, phase) = queue.pop(0)
        number += 1
        rng = random.Random(f"{seed}-{number}")
        night = _night(rig, number, FAULTS.get(fault), phase, rng, place % 5 == 0, ended)
        if night.injected is False:  # it proved nothing: once more, else it is a problem
            if records and records[-1].injected is False and records[-1].fault == fault:
                night.problems.append(f"{fault} at {phase} found nothing to strike twice")
            else:
                queue.insert(0, (place, (fault, phase)))
        champion_checked = _check_champion(rig, night, champion_checked)
        records.append(night)
        _recovery(records)
        problems = f" PROBLEMS: {'; '.join(night.problems)}" if night.problems else ""
        log(
            f"night {number}: {night.fault} at {night.phase} ({night.detail}): "
            f"{night.outcomes}, {night.seconds:.0f} s{problems}"
        )
        if "lost" in night.outcomes.values():  # the stack is stuck: later nights only wait too
            log(f"stopped after night {number}: a run did not end")
            return
    # the last window for a late alert (each night's checks saw those about the nights before)
    time.sleep(_LATE_ALERT_S)
    rig.webhook.drain()
    every_alert = [a for _, a in rig.webhook.seen if "run " in a["subject"]]
    records[-1].problems += [
        f"over the soak: {p}" for p in checks.alert_problems(ended, every_alert)
    ]


def _night(
    rig: Rig,
    number: int,
    fault: Fault | None,
    phase: str,
    rng: random.Random,
    manual: bool,
    earlier: list[FlowRun],
) -> Night:
    night = Night(number, fault.name if fault else "none", phase)
    started = time.time()
    parameters = {
        **rig.archive,
        "epochs": 4,
        "seed": number,
        "batch_size": 64,
        "rows_per_file": 250,
        "registered_model_name": MODEL,
        "timeout_minutes": 20,
    }
    job = {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(rig.bounds.heartbeat_s)}}
    runs = {"nightly": _start("train-cifar/nightly", parameters, job)}
    if manual:
        runs["manual"] = _start("train-cifar/manual", {**parameters, "seed": 1000 + number}, job)
    injector = None
    if fault is not None:
        injector = threading.Thread(  # in this context: the rig's Prefect API
            target=contextvars.copy_context().run,
            args=(_inject, rig, night, fault, runs["nightly"], rng),
        )
        injector.start()
    ended = _wait_final(list(runs.values()), rig.bounds.night_s)
    if injector is not None:
        injector.join()
    night.ended_at = time.time()
    night.seconds = night.ended_at - started
    for name, run in zip(runs, ended, strict=True):
        night.outcomes[name] = run.state.name if run.state and run.state.is_final() else "lost"
        if night.outcomes[name] == "lost":
            night.problems.append(f"the {name} run did not end within {rig.bounds.night_s:g} s")
    if fault is not None and fault.rides_through and night.outcomes["nightly"] != "Completed":
        night.problems.append(
            f"{fault.name} is ridden through, yet the nightly ended {night.outcomes['nightly']}"
        )
    night.problems += _after_night(rig, night, ended, earlier)
    earlier += ended
    return night


def _start(deployment: str, parameters: dict[str, Any], job: dict[str, Any]) -> FlowRun:
    """A run of ``deployment`` due now, as the scheduler (or a user) creates one."""
    return run_deployment(deployment, parameters=parameters, job_variables=job, timeout=0)


def _inject(rig: Rig, night: Night, fault: Fault, run: FlowRun, rng: random.Random) -> None:
    """Wait for the phase's task to begin (or the run to end), a moment more, then strike."""
    deadline = time.monotonic() + rig.bounds.night_s
    while time.monotonic() < deadline:
        if night.phase == "train":  # its ranks are running (task runs are recorded late)
            if rank_processes():
                break
        elif any(name.startswith(night.phase) for name in _task_names(run)):
            break
        if _ended(run):
            break
        time.sleep(0.3)
    time.sleep(rng.uniform(0, 3))
    night.injected_at = time.time()
    if _ended(run):
        night.injected, night.detail = False, "not injected: the run had ended"
        return
    try:
        night.detail = fault.inject(rig, rng)
        night.injected = True
    except NotInjected as nothing:
        night.injected, night.detail = False, f"not injected: {nothing}"
    except Exception as error:
        night.problems.append(f"the fault could not be injected: {error!r}")


def _task_names(run: FlowRun) -> list[str]:
    try:
        with get_client(sync_client=True) as client:
            return [
                t.name
                for t in client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
                )
            ]
    except Exception:  # the server is down (another fault): try again
        return []


def _ended(run: FlowRun) -> bool:
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run.id).state
    except Exception:
        return False
    return state is not None and state.is_final()


def _wait_final(runs: list[FlowRun], timeout: float) -> list[FlowRun]:
    deadline = time.monotonic() + timeout
    latest = list(runs)
    while time.monotonic() < deadline:
        try:
            with get_client(sync_client=True) as client:
                latest = [client.read_flow_run(run.id) for run in runs]
        except Exception:  # the server is down: the runs go on
            time.sleep(1)
            continue
        if all(run.state is not None and run.state.is_final() for run in latest):
            break
        time.sleep(1)
    return latest


def _after_night(rig: Rig, night: Night, runs: list[FlowRun], earlier: list[FlowRun]) -> list[str]:
    """The checks, once alerts about a failed run had time to arrive. A night whose runs all
    completed waits for none: a wrong alert about them arrives during the next night, whose
    checks (or the soak's last window) find it."""
    failed = any(r.state and r.state.is_final() and not r.state.is_completed() for r in runs)
    deadline = time.monotonic() + (60 if failed else 0)
    alerts = [a for _, a in rig.webhook.drain()]
    while time.monotonic() < deadline:
        alerts += [a for _, a in rig.webhook.drain()]
        if failed and all(
            any(f"run {r.name} " in a["subject"] for a in alerts)
            for r in runs
            if r.state and not r.state.is_completed()
        ):
            time.sleep(5)  # a second (duplicate) alert would come now
            alerts += [a for _, a in rig.webhook.drain()]
            break
        time.sleep(1)
    stamps = [t for t, _ in rig.webhook.seen if night.injected_at and t >= night.injected_at]
    crashed = [
        r.state.timestamp.timestamp()
        for r in runs
        if r.state and r.state.is_final() and not r.state.is_completed()
    ]
    if night.injected_at is not None and (stamps or crashed):
        night.detected_s = min([*stamps, *crashed]) - night.injected_at
    completed = any(r.state and r.state.is_completed() for r in runs)
    problems = checks.alert_problems(runs, [a for a in alerts if "run " in a["subject"]])
    problems += checks.incident_problems(alerts)
    problems += _late_alerts(earlier, alerts)
    problems += checks.zombie_problems(rig)
    problems += checks.registry_problems(rig, swept=completed)
    problems += checks.leftover_problems(rig, swept=completed)
    night.storage_mb = checks.storage_use(rig)
    night.outcomes["alerts"] = str(len(alerts))
    return problems


_LATE_ALERT_S = 10  # automations act within seconds of a run's final state


def _late_alerts(earlier: list[FlowRun], alerts: list[dict[str, Any]]) -> list[str]:
    """Alerts naming a run of an earlier night: a Completed one's is wrong, a failed one's a
    second."""
    return [
        f"{r.name} (an earlier night's) ended {r.state.name if r.state else None}, alerted again"
        for r in earlier
        if any(f"run {r.name} " in a["subject"] for a in alerts)
    ]


def _check_champion(rig: Rig, night: Night, checked: str | None) -> str | None:
    """``@champion`` loads in a new process, checked each time it moves."""
    from mlflow.tracking import MlflowClient

    try:
        version = str(
            MlflowClient(rig.mlflow.url).get_model_version_by_alias(MODEL, "champion").version
        )
    except Exception:
        return checked
    if version != checked:
        night.problems += checks.champion_loads(rig)
    return version


def _recovery(records: list[Night]) -> None:
    """A fault's recovery: from its injection to the end of the next Completed nightly."""
    completed: Night | None = None
    for night in reversed(records):
        if night.outcomes.get("nightly") == "Completed":
            completed = night
        if night.injected_at is not None and night.recovered_s is None and completed:
            night.recovered_s = completed.ended_at - night.injected_at

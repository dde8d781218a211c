"""The sentinel's rules: an incident is reported once when it has lasted its bound; a run's
silence counts only while the server is up; a nightly is overdue from its last completion."""

from __future__ import annotations

import pytest

from deployments.sentinel import Incident, overdue, parse, silent_since


def test_sentinel_an_incident_is_reported_once_after_its_bound_and_again_after_it_ended() -> None:
    incident = Incident(bound_s=300)
    assert [incident.observe(True, t) for t in (0, 100, 299)] == [False, False, False]
    assert incident.observe(True, 300)
    assert not incident.observe(True, 900)  # the same incident: once
    assert not incident.observe(False, 901)
    assert not incident.observe(True, 1000)
    assert incident.observe(True, 1300)  # a new incident


def test_sentinel_silence_counts_only_while_the_server_is_up() -> None:
    # heartbeat at 100, server down from 150 to 400: silent since 400, not 100
    assert silent_since(last_heartbeat=100, started=50, up_since=400) == 400
    assert silent_since(last_heartbeat=500, started=50, up_since=400) == 500
    # a run that died before its first heartbeat: silent since it started
    assert silent_since(last_heartbeat=None, started=450, up_since=400) == 450


def test_sentinel_a_nightly_is_overdue_26_hours_after_the_last_completed_one() -> None:
    day = 26 * 3600
    assert not overdue(last_completed=1000, watching_since=0, now=1000 + day, within_s=day)
    assert overdue(last_completed=1000, watching_since=0, now=1001 + day, within_s=day)
    # a stack that never completed one: counted from when the sentinel started watching
    assert not overdue(last_completed=None, watching_since=5000, now=5000 + day, within_s=day)
    assert overdue(last_completed=None, watching_since=5000, now=5001 + day, within_s=day)


def test_sentinel_needs_a_webhook_and_reads_its_bounds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CIFAR_ALERTS_URL", raising=False)
    with pytest.raises(SystemExit):
        parse([])
    assert "give the webhook: --url or $CIFAR_ALERTS_URL" in capsys.readouterr().err
    monkeypatch.setenv("CIFAR_SENTINEL_ZOMBIE_S", "20")
    config = parse(["--url", "http://hook", "--check", "mlflow=http://mlflow:5000/health"])
    assert config.zombie_s == 20 and config.checks == {"mlflow": "http://mlflow:5000/health"}
    assert config.nightly_within_s == 26 * 3600

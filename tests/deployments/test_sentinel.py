"""The sentinel's rules on generated timelines: an incident is reported once after its bound
(across restarts too); a live run is never silent whatever outages, dropped events and clock
steps the server goes through, a dead one is within a bound; a scheduled deployment is
overdue exactly when its due run did not complete; its disk, certificate and saved-state
checks."""

from __future__ import annotations

import datetime
from datetime import timedelta, timezone
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st
from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule
from prefect.settings import PREFECT_API_URL, temporary_settings

from deployments import host_checks, sentinel_state
from deployments.schedule_fires import last_fire
from deployments.sentinel import Sentinel, SentinelConfig, parse
from deployments.watch_rules import Incident, due, kept, overdue, silence
from tests.helpers import free_port

INTERVAL, ZOMBIE, BEAT = 15.0, 90.0, 30.0  # the stack's: a round, the bound, a heartbeat
GAP = 3 * INTERVAL


def test_sentinel_an_incident_is_reported_once_after_its_bound_and_again_after_it_ended() -> None:
    incident = Incident(bound_s=300)
    assert [incident.observe(True, t) for t in (0, 100, 299)] == [False, False, False]
    assert incident.observe(True, 300)
    assert not incident.observe(True, 900)  # the same incident: once
    assert not incident.observe(False, 901)
    assert not incident.observe(True, 1000)
    assert incident.observe(True, 1300)  # a new incident


@given(restarts=st.lists(st.integers(min_value=1, max_value=60), max_size=5))
def test_sentinel_an_incident_restored_after_restarts_keeps_its_clock_and_its_report(
    restarts: list[int],
) -> None:
    """Restarted at any rounds (the state saved and restored each time), an incident failing
    from 0 is reported once, at its bound, as it is without restarts."""
    incident, reports = Incident(bound_s=30), []
    for t in range(0, 100):
        if t in restarts:
            restored = Incident(bound_s=30)
            restored.restore(incident.saved())
            incident = restored
        if incident.observe(True, float(t)):
            reports.append(t)
    assert reports == [30]


@st.composite
def timelines(draw: st.DrawFn) -> tuple[list[list[object]], list[float], float, float]:
    """Rounds of a sentinel on a server's clock with outages (the database down: nothing
    stored, heartbeats lost), dropped events, clock steps of the server and slow rounds; a run
    that heartbeats every BEAT while alive. Returns the stored events, the heartbeats the
    server stored, when the run died (inf: never) and when the timeline ends."""
    end = draw(st.floats(min_value=600, max_value=3000))
    outages = draw(st.lists(st.tuples(st.floats(0, end), st.floats(1, 900)), max_size=3))
    steps = draw(st.lists(st.tuples(st.floats(0, end), st.floats(1, 600)), max_size=2))
    dies = draw(st.one_of(st.just(float("inf")), st.floats(0, end)))
    drops = draw(st.sets(st.integers(0, 400), max_size=5))

    def down(t: float) -> bool:
        return any(a <= t < a + length for a, length in outages)

    def server(t: float) -> float:  # the server's clock: forward steps
        return t + sum(size for at, size in steps if t >= at)

    stored: list[list[object]] = []
    fresh, t, n = True, 0.0, 0
    while t < end:
        if down(t):
            fresh = True  # a round that found the server not ready
        else:
            if n not in drops:
                stored.append([server(t), fresh])
            fresh = False
        n += 1
        t += INTERVAL * draw(st.sampled_from([1.0, 1.0, 1.0, 1.3, 2.5]))
    beats = [server(b) for b in _range(0.0, min(dies, end), BEAT) if not down(b)]
    return stored, beats, dies, end


def _range(start: float, stop: float, step: float) -> list[float]:
    return [start + i * step for i in range(int((stop - start) // step) + 1)]


@settings(max_examples=300, deadline=None)
@given(timelines())
def test_sentinel_a_live_run_is_never_silent_and_a_dead_one_is_within_a_bound(
    timeline: tuple[list[list[object]], list[float], float, float],
) -> None:
    stored, beats, dies, end = timeline
    for i in range(1, len(stored) + 1):  # the sentinel's judgement at each round
        seen, now = stored[:i], float(stored[i - 1][0])  # type: ignore[arg-type]
        heard = max((b for b in beats if b <= now), default=0.0)
        quiet = silence(heard, seen, GAP)
        if dies == float("inf"):
            assert quiet <= ZOMBIE, (quiet, heard, now)
    # dead for long enough on a server that stores steadily: found silent
    if dies < end and beats and _steady_after(stored, beats[-1], ZOMBIE + 2 * GAP):
        assert silence(beats[-1], stored, GAP) > ZOMBIE


def _steady_after(stored: list[list[object]], since: float, span: float) -> bool:
    """Whether the server stored events with no break from ``since`` for ``span``."""
    after = [(float(t), f) for t, f in stored if float(t) > since]  # type: ignore[arg-type]
    if not after or after[0][0] - since > GAP or after[-1][0] - since < span:
        return False
    pairs = zip([(since, False), *after], after, strict=False)
    return all(not fresh and b - a <= GAP for (a, _), (b, fresh) in pairs)


def test_sentinel_silence_breaks_at_a_fresh_event_a_gap_and_a_clock_going_back() -> None:
    steady = [[t, False] for t in (100.0, 115.0, 130.0, 145.0, 160.0)]
    assert silence(100.0, steady, GAP) == 60.0
    assert silence(100.0, [*steady[:2], [130.0, True], *steady[3:]], GAP) == 30.0  # not ready
    assert silence(100.0, [*steady[:2], *([t + 60, f] for t, f in steady[2:])], GAP) == 30.0
    assert silence(100.0, [*steady, [150.0, False], [165.0, False]], GAP) == 15.0  # went back
    assert silence(200.0, steady, GAP) == 0.0  # nothing stored since
    assert kept(steady, 30.0) == steady[1:]  # the one that marks where counting may start


def _daily_run(day: int, took_h: float) -> tuple[float, float]:
    start = datetime.datetime(2026, 1, 1, 2, tzinfo=timezone.utc) + timedelta(days=day)
    return start.timestamp(), (start + timedelta(hours=took_h)).timestamp()


@settings(max_examples=100, deadline=None)
@given(
    stops=st.integers(min_value=3, max_value=20),
    took_h=st.floats(min_value=0.1, max_value=5),
    hours=st.floats(min_value=0, max_value=72),
)
def test_sentinel_a_nightly_is_overdue_exactly_when_its_due_run_did_not_complete(
    stops: int, took_h: float, hours: float
) -> None:
    """A 02:00 cron whose runs take ``took_h`` and complete every night until day ``stops``;
    looked at ``hours`` after that night's start: overdue when a night after the last completed
    one has had its run's time and the grace (2 h)."""
    cron = CronSchedule(cron="0 2 * * *", timezone="UTC")
    created, _ = _daily_run(0, 0)
    last_end = _daily_run(stops - 1, took_h)[1]
    now = _daily_run(stops, 0)[0] + hours * 3600
    allowance = took_h * 3600 + 2 * 3600
    due_at = due([last_fire(cron, now - allowance)], since=created - 60)
    expected = hours * 3600 >= allowance  # night `stops` (and later) had its time
    assert overdue(due_at, last_end) == expected
    # a deployment created after that fire is not overdue for it
    assert not overdue(due([last_fire(cron, now - allowance)], since=now), None)


def test_sentinel_an_interval_schedule_fires_as_the_server_plans() -> None:
    every = IntervalSchedule(
        interval=timedelta(hours=6), anchor_date=datetime.datetime(2026, 1, 1, tzinfo=timezone.utc)
    )
    at = datetime.datetime(2026, 3, 3, 13, 30, tzinfo=timezone.utc).timestamp()
    assert (
        last_fire(every, at) == datetime.datetime(2026, 3, 3, 12, tzinfo=timezone.utc).timestamp()
    )


def _certificate(path: Path, days: float) -> float:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = datetime.datetime.now(timezone.utc)
    ends = now + timedelta(days=days)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(ends)
        .sign(key, hashes.SHA256())
    )
    with open(path, "ab") as out:
        out.write(certificate.public_bytes(serialization.Encoding.PEM))
    return ends.replace(microsecond=0).timestamp()


def test_sentinel_reads_the_first_expiry_of_a_certificate_file_and_names_a_bad_one(
    tmp_path: Path,
) -> None:
    chain = tmp_path / "chain.pem"
    _certificate(chain, 400)
    soonest = _certificate(chain, 12)
    assert host_checks.expires(str(chain)) == soonest
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n")
    with pytest.raises(ValueError, match=r"key\.pem holds no PEM certificate"):
        host_checks.expires(str(tmp_path / "key.pem"))
    assert 0 <= host_checks.used_percent(str(tmp_path)) <= 100


def test_sentinel_state_survives_a_restart_a_cut_file_and_says_when_rounds_stopped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "sentinel.json"
    assert (
        sentinel_state.unhealthy(path, 100.0, 60.0) == f"no round has ended yet ({path} holds none)"
    )
    state = sentinel_state.SavedState(
        incidents={"prefect": {"since": 5.0, "reported": True}},
        stored=[[10.0, True], [25.0, False]],
        unsent=[["subject", "body"]],
        last_round=90.0,
    )
    sentinel_state.save(path, state)
    assert sentinel_state.load(path) == state
    assert sentinel_state.unhealthy(path, 100.0, 60.0) is None
    assert "ended 100 s ago" in str(sentinel_state.unhealthy(path, 190.0, 60.0))
    path.write_text(path.read_text()[:20])  # cut short by a full disk
    assert sentinel_state.load(path) == sentinel_state.SavedState()
    assert list(path.parent.iterdir()) == [path]  # no temporary file left


def test_sentinel_needs_a_webhook_and_reads_its_bounds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("CIFAR_ALERTS_URL", raising=False)
    with pytest.raises(SystemExit):
        parse([])
    assert "give the webhook: --url or $CIFAR_ALERTS_URL" in capsys.readouterr().err
    monkeypatch.setenv("CIFAR_SENTINEL_ZOMBIE_S", "20")
    monkeypatch.setenv("CIFAR_SENTINEL_DISKS", "pg=/var/lib/postgresql s3=/data")
    monkeypatch.setenv("CIFAR_SENTINEL_STATE", str(tmp_path / "s.json"))
    config = parse(["--url", "http://hook", "--check", "mlflow=http://mlflow:5000/health"])
    assert config.zombie_s == 20 and config.checks == {"mlflow": "http://mlflow:5000/health"}
    assert config.disks == {"pg": "/var/lib/postgresql", "s3": "/data"}
    assert config.grace_s == 2 * 3600 and config.state_path == tmp_path / "s.json"
    with pytest.raises(SystemExit):
        parse(["--url", "http://hook", "--disk", "/no-name"])
    assert "--disk takes NAME=/a/path, not /no-name" in capsys.readouterr().err


def test_sentinel_a_round_whose_state_cannot_be_saved_goes_on_and_sends_its_alerts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk under the state file: the round logs it and still sends (the healthcheck
    then fails, and the disk check alerts)."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    sent: list[str] = []
    config = SentinelConfig(
        webhook_url="http://unused", down_s=0, state_path=blocked / "state.json"
    )
    watcher = Sentinel(config, send=lambda subject, body: sent.append(subject) or True)
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        watcher.round()
    assert sent == ["Prefect server not ready for 0 s"]
    assert "The state could not be saved" in caplog.text

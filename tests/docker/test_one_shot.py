"""docker/one_shot.py: a one-shot service's failure is a failure, whatever compose says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
sys.path.insert(0, str(DOCKER))
import one_shot  # noqa: E402  (a script of the repository, not a package)


def test_one_shot_takes_the_containers_status_from_podman_compose_output() -> None:
    assert one_shot.status(0, "... \nexit code: 3\n") == 3  # podman-compose 1.0 exits 0
    assert one_shot.status(0, "deployed\nexit code: 0\n") == 0
    assert one_shot.status(2, "") == 2  # docker compose: its own status is the container's


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_one_shot_fails_with_the_services_status_and_last_lines(tmp_path: Path) -> None:
    compose = tmp_path / "compose"
    compose.write_text(
        '#!/bin/sh\necho "deploying"\necho "404 Deployment not found"\necho "exit code: 7"\n'
    )
    compose.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(DOCKER / "one_shot.py"), str(compose), "--", "deploy"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 7
    assert "one_shot: deploy failed (exit status 7)" in done.stderr
    assert "404 Deployment not found" in done.stderr

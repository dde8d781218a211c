"""The stack under test, one for the session: every module of tests/containers uses it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.containers.stack import (
    ENGINE_ENV,
    REPO,
    Stack,
    leftovers,
    new_stack,
    remove_networks,
    skip_reason,
    up,
)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Images built (cached after the first time), the stack up and healthy, deploy run."""
    if (reason := skip_reason()) is not None:
        pytest.skip(reason)
    stack = new_stack(tmp_path_factory.mktemp("secrets"))
    subprocess.run(
        ["bash", "docker/build-local.sh"],
        cwd=REPO,
        env={**os.environ, **ENGINE_ENV, "GIT_SHA": stack.env["GIT_SHA"]},
        check=True,
        timeout=3000,
    )
    stack.compose("down", "-v", check=False)
    try:
        up(stack)
        yield stack
    finally:
        stack.compose("down", "-v", check=False)
        remove_networks()
    assert leftovers() == []

"""A real Prefect server and process worker, started on free ports for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.prefect_stack import prefect_stack


@pytest.fixture(scope="session")
def prefect_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment of a running Prefect server with a process work pool and worker."""
    with prefect_stack(tmp_path_factory.mktemp("prefect-home")) as env:
        yield env

"""Prefect's own temporary server (what Prefect starts at a flow's first call without
PREFECT_API_URL; the commands start theirs earlier, with `prefect server start`:
cli/local_server.py): seconds until it answers /health, on a new PREFECT_HOME (Prefect creates
and migrates its database) and again on the same one (the database exists), and to stop.

Run: python benchmarks/prefect_server.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def _start_and_stop(home: str) -> tuple[float, float]:
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_HOME: home}):  # passed on to the server process
        started = time.perf_counter()
        server = SubprocessASGIServer()
        server.start(timeout=300)
        up = time.perf_counter()
        server.stop()
    if not os.path.exists(os.path.join(home, "prefect.db")):
        raise RuntimeError(f"the server did not use PREFECT_HOME={home}")
    return up - started, time.perf_counter() - up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.pop("PREFECT_API_URL", None)
    new_db, existing_db, stop = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as home:
            for times in (new_db, existing_db):
                start_s, stop_s = _start_and_stop(home)
                times.append(start_s)
                stop.append(stop_s)
    print(
        f"medians over {args.runs} runs: start on a new PREFECT_HOME "
        f"{statistics.median(new_db):.1f} s, start with its database made "
        f"{statistics.median(existing_db):.1f} s, stop {statistics.median(stop):.1f} s"
    )


if __name__ == "__main__":
    main()

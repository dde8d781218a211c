#!/usr/bin/env python3
"""Run a one-shot service of the stack and exit with its container's exit status.

    python3 docker/one_shot.py podman-compose -p dask-train-cifar -f ... -- deploy

Runs ``COMPOSE... run --rm SERVICE``, printing its output. ``docker compose run`` exits with the
container's status, but podman-compose 1.0 exits 0 whatever the container did and only prints
``exit code: N``: a deploy step that failed looked like a success, and the stack came up without
its deployments. Here a failure is a failure: the status is the container's, and the last lines
of its output are repeated after one line naming the service.
"""

from __future__ import annotations

import re
import subprocess
import sys

EXIT_LINE = re.compile(r"^exit code: (\d+)\s*$", re.MULTILINE)
TAIL_LINES = 20


def status(compose_status: int, output: str) -> int:
    """The container's status: podman-compose's last ``exit code: N`` line, else the
    compose command's own status."""
    found = EXIT_LINE.findall(output)
    if compose_status == 0 and found:
        return int(found[-1])
    return compose_status


def main(argv: list[str]) -> None:
    split = argv.index("--")
    compose, service = argv[:split], argv[split + 1 :]
    done = subprocess.run(
        [*compose, "run", "--rm", *service], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    output = done.stdout.decode(errors="replace")
    sys.stdout.write(output)
    code = status(done.returncode, output)
    if code != 0:
        tail = "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])
        what = " ".join(service)
        print(
            f"one_shot: {what} failed (exit status {code}); its last lines:\n{tail}",
            file=sys.stderr,
        )
        sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

"""``make soak``: python -m tests.soak [--nights N] [--seed N] [--fault NAME ...] [--root DIR]

Prints each night as it ends, then the table (docs/reliability.md holds the last full one);
exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import uuid
from pathlib import Path

from tests.helpers import SESSION_VARIABLE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nights", type=int, default=None, help="default: one per fault and phase (39 as root)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault", action="append", help="the faults, in order (default: drawn)")
    parser.add_argument("--root", type=Path, default=None, help="where the rig keeps its data")
    args = parser.parse_args()
    os.environ.setdefault(SESSION_VARIABLE, uuid.uuid4().hex)  # marks this soak's processes
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped: the rig is torn down
    from tests.soak.rig import clean_root
    from tests.soak.soak import run_soak

    root = clean_root(args.root or Path(tempfile.mkdtemp(prefix="soak-")))
    soak = run_soak(root, args.nights, args.seed, args.fault)
    print(soak.table())
    print(f"{len(soak.nights)} nights, {soak.trainings} trainings, overlaps: {len(soak.overlaps)}")
    for problem in soak.problems:
        print("PROBLEM:", problem)
    sys.exit(1 if soak.problems else 0)


if __name__ == "__main__":
    main()

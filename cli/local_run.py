"""How a command runs its flow: the console (a paragraph per error, the full log in a file),
the summary printed, the exit status. Its start-up is ``startup.py``, its environment
``environment.py``."""

from __future__ import annotations

import gc
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def run_command(
    command: str,
    run: Callable[[], dict[str, Any]],
    *,
    log_file: str,
    debug: bool,
    exits: bool,
) -> int:
    """Run a flow: its summary as JSON on stdout, or one paragraph per error on stderr.

    Returns the exit status (0, 1 after an error, 130 after Ctrl-C). ``exits``: the process
    ends with the command (run from the command line, not called).
    """
    from cli.console import console_logging, explain

    log_path = Path(log_file).resolve()
    try:
        with console_logging(log_path, debug=debug):
            try:
                summary = run()
            except (Exception, KeyboardInterrupt) as error:
                if debug:
                    traceback.print_exception(error)
                print(f"\n{explain(error, log_path, command)}", file=sys.stderr)
                return EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_FAILED
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        if exits:
            # Python's last garbage collection at exit walks the whole heap (torch, Prefect,
            # MLflow): 2.2 s here, 0.45 s with the heap frozen (benchmarks/cli_exit.py).
            gc.freeze()

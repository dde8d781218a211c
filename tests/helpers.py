"""Helpers shared by tests (not fixtures)."""

from __future__ import annotations

import psutil


def rank_processes() -> list[psutil.Process]:
    """Rank processes alive on this machine now."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "trainlib._rank_main" in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found

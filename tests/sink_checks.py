"""Checks the sinks' tests share: the counting invariant, and a disk that fills under a sink."""

from __future__ import annotations

import os
from pathlib import Path


def assert_exact(stats) -> None:
    """The sinks' invariant, once closed or drained: what was not delivered was dropped."""
    assert stats.pending == 0
    assert stats.dropped == stats.published - stats.delivered


def fill_disk(path: Path) -> None:
    """The disk under ``path`` fills: this process's descriptor open on it now writes to
    ``/dev/full`` (a real ENOSPC on the next write, no small filesystem needed)."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, _descriptor_of(path))
    finally:
        os.close(full)


def _descriptor_of(path: Path) -> int:
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                return int(name)
        except OSError:
            continue
    raise AssertionError(f"no descriptor on {path}")

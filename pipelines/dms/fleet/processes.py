"""The processes this process started, found through ``/proc`` (Linux): a local Ray cluster's,
so that they can be ended — those, and no other (never a machine-wide ``ray stop``, which would
end other users' Ray processes) — where Ray cannot end them itself (the command's second signal
ends the process at once) and where a test session ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Process", "alive", "descendants", "kill"]


@dataclass(frozen=True)
class Process:
    pid: int
    started: int
    """Clock ticks after boot: with the pid, names the process (a pid may be taken again)."""
    command: str


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid``, or None when it has gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def descendants(root: int | None = None) -> set[Process]:
    """Every process below ``root`` (this one by default), as it is now (none where there is
    no ``/proc``)."""
    root = os.getpid() if root is None else root
    if not os.path.isdir("/proc"):
        return set()
    parents: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is not None:
            parents.setdefault(stat[0], []).append(int(entry))
            started[int(entry)] = stat[1]
    found: set[Process] = set()
    queue = list(parents.get(root, []))
    while queue:
        pid = queue.pop()
        if pid in started:
            found.add(Process(pid, started[pid], _command(pid)))
        queue.extend(parents.get(pid, []))
    return found


def alive(process: Process) -> bool:
    """The same process is still there (not a new one with its pid), and not a zombie."""
    stat = _stat(process.pid)
    if stat is None or stat[1] != process.started:
        return False
    try:
        state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill(processes: set[Process]) -> None:
    """SIGKILL ``processes`` that are still alive."""
    for process in processes:
        if alive(process):
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)

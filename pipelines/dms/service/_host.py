"""The host: CPU placement of the model's thread (:func:`loop_kept_off`), and what the host did to
the service (:class:`HostLoad`): how long its CPU quota held it off, and how long its threads
waited for a CPU — the evidence that tells a service *throttled* by its quota from one
*out-competed* by other work, and both from work that simply takes longer than a frame period.

Linux only (cgroup v1 and v2 ``cpu.stat``, each thread's ``schedstat``); elsewhere both figures
stay 0. Reading them is a few small ``/proc`` and ``/sys`` reads, done at most
:data:`SAMPLE_EVERY` seconds apart by the policy's caller.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aio_runtime import run_queue_wait

__all__ = [
    "SAMPLE_EVERY",
    "SLOW_WORK",
    "HostLoad",
    "HostSample",
    "loop_kept_off",
    "overload_cause",
]

SAMPLE_EVERY = 0.5
"""Seconds between two samples of the host's load, at the most."""
THROTTLED_SHARE = 0.05
"""The share of the time the CPU quota held the service off above which it is *throttled*."""
WAITED_SHARE = 0.10
"""Seconds its threads waited for a CPU per second, above which the service is
*out-competed*."""
SLOW_WORK = "its work takes longer than the camera's frame period"
"""The cause when the host shows neither (or cannot say)."""


@dataclass(frozen=True)
class HostSample:
    """Cumulative figures, in seconds, since some moment in the past: compare two."""

    throttled: float
    """Time the CPU quota of this process's control groups held them off."""
    waited: float
    """Time this process's threads spent runnable, waiting for a CPU (summed over them)."""


def overload_cause(earlier: HostSample, later: HostSample, seconds: float) -> str:
    """Why a service that cannot keep up cannot, over the ``seconds`` between two samples."""
    if seconds > 0 and (later.throttled - earlier.throttled) / seconds >= THROTTLED_SHARE:
        return "throttled by its CPU quota"
    if seconds > 0 and (later.waited - earlier.waited) / seconds >= WAITED_SHARE:
        return "out-competed for the CPU"
    return SLOW_WORK


class HostLoad:
    """Samples this process's :class:`HostSample` (its control groups found once)."""

    def __init__(self) -> None:
        self._stats = _cpu_stat_files()

    def sample(self) -> HostSample:
        return HostSample(sum(_throttled(path) for path in self._stats), _threads_waited())


def _threads_waited() -> float:
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    return sum(wait for tid in tids if (wait := run_queue_wait(int(tid))) is not None)


def _throttled(path: Path) -> float:
    """Seconds of throttling a ``cpu.stat`` file counts (v2 ``throttled_usec``, v1
    ``throttled_time`` in ns); 0 when it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "throttled_usec":
            return int(value) / 1e6
        if key == "throttled_time":
            return int(value) / 1e9
    return 0.0


def _cpu_stat_files() -> list[Path]:
    """The ``cpu.stat`` files of this process's control groups and of their ancestors (a quota
    may be set on any of them), for the v1 ``cpu`` controller and for v2."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    roots: list[tuple[Path, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            roots += [(Path("/sys/fs/cgroup"), path), (Path("/sys/fs/cgroup/unified"), path)]
        elif "cpu" in controllers.split(","):
            roots.append((Path("/sys/fs/cgroup") / controllers, path))
    found = []
    for root, path in roots:
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts) + 1):
            stat = root.joinpath(*parts[:depth], "cpu.stat")
            if stat.is_file():
                found.append(stat)
    return found


@contextlib.contextmanager
def loop_kept_off(model_cpus: frozenset[int] | None) -> Iterator[frozenset[int] | None]:
    """Keep the calling thread (the event loop's) off ``model_cpus`` inside the block, and give
    back its CPUs after. Yields the CPUs left for the loop and the warp (None: no placement).

    A model run the loop hands over to a worker thread is otherwise often started on the loop's
    own CPU (the scheduler places a woken thread near its waker) and holds the loop off it for
    milliseconds. Linux only; without model CPUs nothing is touched."""
    if model_cpus is None:
        yield None
        return
    loop_cpus = os.sched_getaffinity(0)
    others = frozenset(loop_cpus - model_cpus) or None
    if others is None:
        yield None
        return
    os.sched_setaffinity(0, others)
    try:
        yield others
    finally:
        os.sched_setaffinity(0, loop_cpus)

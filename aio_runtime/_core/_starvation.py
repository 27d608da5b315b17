"""How long threads waited for a CPU: time in which the host could not run, which is no evidence
against a device.

A host that is slow or busy — its CPU quota spent, other processes taking its CPUs — delays the
threads that watch a device and, for a device simulated on the host, the threads that *are* the
device. Neither is a device that stopped making progress. Linux counts, for every thread, the
time it spent runnable on a run queue waiting for a CPU (``/proc/<pid>/task/<tid>/schedstat``,
its second field, in ns), including the time its CPU quota held it off; :class:`Starvation`
reads it for the runtime's worker threads (:class:`~aio_runtime.WorkerThread`). Elsewhere the
reading is None and no time is discounted.
"""

from __future__ import annotations

from ._threads import worker_thread_ids

__all__ = ["Starvation", "run_queue_wait"]


def run_queue_wait(tid: int | None = None) -> float | None:
    """Seconds the thread ``tid`` of this process (a native thread id; None: the calling thread)
    has spent waiting on a run queue for a CPU since it started; None where the platform does
    not say (or the thread has ended)."""
    path = f"/proc/self/task/{tid}/schedstat" if tid is not None else "/proc/thread-self/schedstat"
    try:
        with open(path, "rb") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class Starvation:
    """The longest a worker thread of the runtime waited for a CPU between two calls of
    :meth:`since_last`: a host that was starved for that long could not have shown a device's
    progress, or (a simulated device) made it. Plain bookkeeping over the kernel's counters: no
    clock."""

    def __init__(self) -> None:
        self._last: dict[int, float] = {}

    def since_last(self) -> float:
        """Seconds: the largest wait of any live worker thread since the last call (0 at the
        first, for threads seen for the first time, and where the platform does not say)."""
        waits: dict[int, float] = {}
        for tid in worker_thread_ids():
            wait = run_queue_wait(tid)
            if wait is not None:
                waits[tid] = wait
        longest = max(
            (wait - self._last[tid] for tid, wait in waits.items() if tid in self._last),
            default=0.0,
        )
        self._last = waits
        return max(0.0, longest)

"""CPU placement: the model's thread on CPUs of its own, the event loop and the warp kept off them.

A model run the loop hands over to a worker thread is otherwise often started on the loop's own
CPU (the scheduler places a woken thread near its waker) and holds the loop off it for
milliseconds. Linux only; without model CPUs nothing is touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["loop_kept_off"]


@contextlib.contextmanager
def loop_kept_off(model_cpus: frozenset[int] | None) -> Iterator[frozenset[int] | None]:
    """Keep the calling thread (the event loop's) off ``model_cpus`` inside the block, and give
    back its CPUs after. Yields the CPUs left for the loop and the warp (None: no placement)."""
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

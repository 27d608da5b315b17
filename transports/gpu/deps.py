"""Ordering work across the GPU's queues by the byte ranges it touches (as tinygrad's HCQ does).

Each piece of work declares the ranges it reads and writes. Before it starts it waits for every
unfinished earlier piece on *another* queue that conflicts with it — a read after a write, a
write after a read or a write — on overlapping bytes. Work on the same queue relies on the
queue's FIFO order; work that touches different bytes runs concurrently. So the copy-in of the
next frame overlaps the current kernel, while the copy-out of a kernel's output waits for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import anyio

from aio_runtime import Layer, SignalTimeout, WaitBound, wait_complete

__all__ = ["DependencyTracker", "Span", "Work"]

Span = tuple[int, int]
"""A byte range [start, end) of bus addresses."""


def _overlap(a: Sequence[Span], b: Sequence[Span]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


@dataclass(eq=False)
class Work:
    queue: str
    name: str
    reads: Sequence[Span]
    writes: Sequence[Span]
    done: anyio.Event = field(default_factory=anyio.Event)

    def conflicts(self, other: Work) -> bool:
        return (
            _overlap(self.writes, other.writes)
            or _overlap(self.reads, other.writes)
            or _overlap(self.writes, other.reads)
        )


class DependencyTracker:
    def __init__(self) -> None:
        self._live: list[Work] = []

    def live(self) -> list[Work]:
        return list(self._live)

    @contextlib.asynccontextmanager
    async def ordered(
        self,
        queue: str,
        name: str,
        *,
        reads: Sequence[Span] = (),
        writes: Sequence[Span] = (),
        timeout: float | None = None,
    ) -> AsyncIterator[Work]:
        """Run the block as work on ``queue`` once the conflicting work on other queues is done
        (each such wait bounded by ``timeout`` or the enclosing deadline:
        :class:`aio_runtime.SignalTimeout` naming the work waited for). The work counts as done
        when the block exits, however it exits."""
        work = Work(queue, name, reads, writes)
        before = [w for w in self._live if w.queue != queue and work.conflicts(w)]
        self._live.append(work)
        try:
            if before:
                bound = WaitBound(
                    awaited=f"{name}: earlier work on other queues",
                    error=SignalTimeout,
                    timeout=timeout,
                    layer=Layer.GPU_QUEUE,
                )
                for earlier in before:
                    await wait_complete(
                        earlier.done,
                        awaited=f"{name}: waits for {earlier.name} ({earlier.queue} queue)",
                        within=bound,
                    )
            yield work
        finally:
            self._live.remove(work)
            work.done.set()

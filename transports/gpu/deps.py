"""Ordering work on the GPU's queues by the byte ranges it touches (as tinygrad's HCQ does).

Each piece of work declares the ranges it reads and writes. Before it starts it waits for every
unfinished earlier piece that conflicts with it — a read after a write, a write after a read or a
write — on overlapping bytes, on any queue: the host decides the order in which work reaches a
queue, so a queue's FIFO order alone would not keep a later write from overtaking an earlier read.
Work that touches different bytes runs concurrently: the copy-in of the next frame overlaps the
current kernel, while the copy-out of a kernel's output waits for it.

Work that fails is done, but not well: whoever was waiting for it gets :class:`DependencyFailed`
naming it, rather than reading what it never wrote.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import anyio

from aio_runtime import Layer, RuntimeFault, SignalTimeout, WaitBound, wait_complete

__all__ = ["DependencyFailed", "DependencyTracker", "Span", "Work"]

Span = tuple[int, int]
"""A byte range [start, end) of bus addresses."""


def _overlap(a: Sequence[Span], b: Sequence[Span]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


class DependencyFailed(RuntimeFault):
    """Work this work depended on (it wrote what this reads, or used what this overwrites)
    failed; its error is the cause."""

    default_layer = Layer.GPU_QUEUE


@dataclass(eq=False)
class Work:
    queue: str
    name: str
    reads: Sequence[Span]
    writes: Sequence[Span]
    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None

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
        """Run the block as work on ``queue`` once the conflicting earlier work is done (each such
        wait bounded by ``timeout`` or the enclosing deadline: :class:`aio_runtime.SignalTimeout`
        naming the work waited for). The work counts as done when the block exits, however it
        exits; if it raised, work waiting for it fails with :class:`DependencyFailed`."""
        work = Work(queue, name, reads, writes)
        before = [w for w in self._live if work.conflicts(w)]
        self._live.append(work)
        try:
            if before:
                bound = WaitBound(
                    awaited=f"{name}: earlier work on the same bytes",
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
                    if earlier.error is not None:
                        raise DependencyFailed(
                            f"{name}: {earlier.name} ({earlier.queue} queue) failed",
                            awaited=f"{name}: waits for {earlier.name}",
                        ) from earlier.error
            yield work
        except BaseException as exc:
            work.error = exc
            raise
        finally:
            self._live.remove(work)
            work.done.set()

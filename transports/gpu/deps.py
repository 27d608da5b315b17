"""Ordering work on the GPU's queues by the byte ranges it touches (as tinygrad's HCQ does).

Each piece of work declares the ranges it reads and writes. Before it starts it waits for every
unfinished earlier piece that conflicts with it — a read after a write, a write after a read or a
write — on overlapping bytes, on any queue: the host decides the order in which work reaches a
queue, so a queue's FIFO order alone would not keep a later write from overtaking an earlier read.
Work that touches different bytes runs concurrently: the copy-in of the next frame may overlap
the current kernel (unless a copy-out queued behind that kernel holds the copy queue), while the
copy-out of a kernel's output waits for it.

Work that started and failed is done, but not well: work that reads what it wrote fails with
:class:`DependencyFailed` naming it, rather than reading bytes it never wrote (a write after it
loses nothing and goes ahead). Work that may still be running on the device after its host side
gave up (a kernel whose wait timed out) *lingers*: it stays live until the device is known to be
done with it (:meth:`DependencyTracker.finish`), so nothing reuses its bytes meanwhile. Work that
waits for lingering work asks the tracker's owner to find out (``settle``: the session reads the
device's timeline), so it goes on as soon as the device is done, whether or not anything else
is waiting on the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from aio_runtime import Layer, RuntimeFault, SignalTimeout, WaitBound, wait_complete

__all__ = ["DependencyFailed", "DependencyTracker", "Settle", "Span", "Work"]

Span = tuple[int, int]
"""A byte range [start, end) of bus addresses."""


def _overlap(a: Sequence[Span], b: Sequence[Span]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


class DependencyFailed(RuntimeFault):
    """Work that wrote bytes this work reads failed; its error is the cause."""

    default_layer = Layer.GPU_QUEUE


@dataclass(eq=False)
class Work:
    queue: str
    name: str
    reads: Sequence[Span]
    writes: Sequence[Span]
    done: anyio.Event = field(default_factory=anyio.Event)
    started: bool = False
    """It got past its waits (it may have touched the device)."""
    error: BaseException | None = None
    lingering: bool = False
    """Set inside the block: on exit the work stays live until :meth:`DependencyTracker.finish`."""

    def conflicts(self, other: Work) -> bool:
        return (
            _overlap(self.writes, other.writes)
            or _overlap(self.reads, other.writes)
            or _overlap(self.writes, other.reads)
        )


Settle = Callable[[Work, WaitBound, str], Awaitable[None]]
"""``settle(work, bound, awaited)``: await the device finishing lingering ``work`` within
``bound`` and :meth:`DependencyTracker.finish` it (``awaited`` names the wait)."""


class DependencyTracker:
    def __init__(self, settle: Settle | None = None) -> None:
        self._live: list[Work] = []
        self._settle = settle

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
        tolerate_failures: bool = False,
    ) -> AsyncIterator[Work]:
        """Run the block as work on ``queue`` once all conflicting earlier work is done (the
        wait bounded by ``timeout`` or the enclosing deadline: :class:`aio_runtime.SignalTimeout`
        naming the work waited for). Then, unless ``tolerate_failures``, fail with
        :class:`DependencyFailed` if work that wrote what this reads failed. The work is done
        when the block exits — unless it set ``lingering``."""
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
                    note = " — it may still be running on the device" if earlier.lingering else ""
                    awaited = f"{name}: waits for {earlier.name} ({earlier.queue} queue){note}"
                    if earlier.lingering and not earlier.done.is_set() and self._settle:
                        await self._settle(earlier, bound, awaited)
                    await wait_complete(earlier.done, awaited=awaited, within=bound)
                failed = [
                    w
                    for w in before
                    if w.started and w.error is not None and _overlap(reads, w.writes)
                ]
                if failed and not tolerate_failures:
                    raise DependencyFailed(
                        f"{name}: {failed[0].name} ({failed[0].queue} queue), which wrote what "
                        "it reads, failed",
                        awaited=f"{name}: waits for {failed[0].name}",
                    ) from failed[0].error
            work.started = True
            yield work
        except BaseException as exc:
            if work.started:
                work.error = exc
            raise
        finally:
            if not work.lingering:
                self.finish(work)

    def finish(self, work: Work) -> None:
        """The device is done with ``work`` (a lingering one): those waiting for it go on."""
        if work in self._live:
            self._live.remove(work)
        work.done.set()

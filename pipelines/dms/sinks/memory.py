"""The in-process sink: every message, to every subscriber, for applications that embed the service.

``subscription = subscriptions.subscribe()`` registers a subscriber at once (it misses nothing
published after the call); ``async for message in subscription:`` reads, until the publisher
closes. Each subscriber has a backlog of its own:

- live: at most ``backlog`` messages wait (default :data:`~.base.LIVE_BACKLOG`); past
  that the oldest is dropped (latest wins), counted, and logged when dropping starts and stops.
  The ``seq`` numbers show the gap too.
- replay: nothing is dropped while the subscriber reads; the producer awaits
  :meth:`Subscriptions.room`, which returns once every subscriber holds fewer than ``backlog``.
  A subscriber that holds the replay — its backlog full — without taking a message for
  ``stall_limit`` seconds is closed: it is no longer sent messages (each counted as dropped to
  it), it may still read what it holds, and its iterator then raises
  :class:`~.base.SubscriptionStalled`. The replay goes on for the others.

A subscription that is garbage-collected (its reader broke out of the loop and let it go) or
closed with :meth:`Subscription.aclose` leaves: what it held counts as dropped.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque

import anyio

from aio_runtime import get_logger

from ..config.kinds import Mode
from ..config.values import positive
from ..messages import DriverStateV2
from .base import (
    DRAIN_TIMEOUT,
    LIVE_BACKLOG,
    STALL_LIMIT,
    DropLog,
    SinkError,
    SinkStats,
    SubscriptionStalled,
    check_backlog,
)

__all__ = ["Subscription", "Subscriptions"]

_log = get_logger(__name__)


class _Queue:
    """One subscriber's backlog and counts (kept apart from its iterator, which may be collected
    while the queue is still counted)."""

    def __init__(self, name: str, backlog: int) -> None:
        self.name = name
        self.backlog = backlog
        self.messages: deque[DriverStateV2] = deque()
        self.published = self.delivered = self.dropped = 0
        self.wake = anyio.Event()
        self.ended = False
        """No more messages come (the publisher closed, or the subscriber left)."""
        self.stalled: SubscriptionStalled | None = None
        self.full_since: float | None = None
        """When a replay first waited on this full backlog since the subscriber last read."""
        self.drops = DropLog(name, backlog=backlog)

    def full(self) -> bool:
        return not self.ended and len(self.messages) >= self.backlog

    def discard(self) -> None:
        """Everything held is dropped, counted."""
        self.dropped += len(self.messages)
        self.messages.clear()

    def end(self) -> None:
        self.ended = True
        self.wake.set()


class Subscription:
    """One subscriber's stream: an async iterator of messages (see the module's description)."""

    def __init__(self, owner: Subscriptions, queue: _Queue) -> None:
        self._owner = owner
        self._queue = queue
        weakref.finalize(self, owner._leave, queue)

    @property
    def name(self) -> str:
        return self._queue.name

    def stats(self) -> SinkStats:
        return self._owner._stats_of([self._queue], self._queue.name)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> DriverStateV2:
        queue = self._queue
        while not queue.messages:
            if queue.stalled is not None:
                self._owner._leave(queue)
                raise queue.stalled
            if queue.ended:
                raise StopAsyncIteration
            queue.wake = anyio.Event()
            await queue.wake.wait()
        queue.delivered += 1
        queue.full_since = None
        self._owner._read(queue)
        return queue.messages.popleft()

    async def aclose(self) -> None:
        """Leave: no more messages; what is held counts as dropped."""
        self._owner._leave(self._queue)


class Subscriptions:
    """In-process fan-out. ``async for message in subscriptions.subscribe(): ...``

    ``delivery``: live or replay; ``backlog``: each subscriber's bound (a subscriber may ask for
    its own); ``stall_limit``: seconds a subscriber may hold a replay without reading before it is
    closed. The statistics are those of every subscriber there has been, together."""

    def __init__(
        self,
        *,
        delivery: Mode = Mode.LIVE,
        backlog: int = LIVE_BACKLOG,
        stall_limit: float = STALL_LIMIT,
        name: str = "subscriptions",
    ) -> None:
        self._backlog = check_backlog(backlog)
        problem = positive(stall_limit)
        if problem is not None:
            raise ValueError(f"stall_limit {problem}, got {stall_limit!r}")
        self._name = name
        self._delivery = delivery
        self._stall_limit = float(stall_limit)
        self._queues: dict[int, _Queue] = {}
        self._left = _Queue("left", 1)
        """The counts of the subscribers that left (their queues are let go)."""
        self._numbers = itertools.count(1)
        self._closed = False
        self._progress = anyio.Event()
        """Set whenever a subscriber reads or leaves: a replay waiting for room looks again."""

    @property
    def name(self) -> str:
        return self._name

    @property
    def delivery(self) -> Mode:
        return self._delivery

    def subscribe(self, *, backlog: int | None = None) -> Subscription:
        """A new subscriber, registered now; ``backlog``: its bound (default: this sink's)."""
        queue = _Queue(
            f"{self._name}#{next(self._numbers)}",
            self._backlog if backlog is None else check_backlog(backlog),
        )
        if self._closed:
            queue.end()
        else:
            self._queues[id(queue)] = queue
        return Subscription(self, queue)

    def publish(self, message: DriverStateV2) -> None:
        live = self._delivery is Mode.LIVE
        for queue in self._queues.values():
            queue.published += 1
            if queue.stalled is not None or queue.ended:
                queue.dropped += 1  # closed: counted, not queued
                continue
            if live and len(queue.messages) >= queue.backlog:
                queue.messages.popleft()  # the oldest goes: latest wins
                queue.dropped += 1
                queue.drops.dropped(why="the subscriber is behind")
            elif live and len(queue.messages) <= queue.backlog // 2:
                queue.drops.delivering()
            queue.messages.append(message)
            queue.wake.set()

    async def room(self) -> None:
        """Replay: return once every subscriber holds fewer than its backlog, closing any that
        held the replay ``stall_limit`` seconds without reading. Live: at once."""
        if self._delivery is Mode.LIVE:
            return
        while True:
            full = [q for q in self._queues.values() if q.full() and q.stalled is None]
            if not full:
                return
            now = anyio.current_time()
            for queue in full:
                if queue.full_since is None:
                    queue.full_since = now
                elif now - queue.full_since >= self._stall_limit:
                    self._stall(queue)
            waiting = [q.full_since for q in full if q.stalled is None and q.full_since is not None]
            if not waiting:
                continue
            with anyio.move_on_at(min(waiting) + self._stall_limit):
                await self._progress.wait()

    def endpoint(self) -> tuple[str, str] | None:
        return None  # in this process: it listens nowhere

    def failure(self) -> SinkError | None:
        return None  # in-process delivery cannot fail

    async def wait_failure(self) -> SinkError | None:
        """None, at once: in-process delivery cannot fail."""
        return None

    def stats(self) -> SinkStats:
        return self._stats_of([*self._queues.values(), self._left], self._name)

    def close(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """No more messages: each subscriber reads what it holds, then its iterator ends.
        (``timeout`` is for :meth:`aclose`: a reader can only drain from a running loop.)"""
        self._closed = True
        for queue in self._queues.values():
            queue.end()
        return self.stats()

    async def aclose(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """Close, wait up to ``timeout`` seconds for the subscribers to read what they hold, then
        drop (counted) whatever is still held: ``pending`` is then 0."""
        self.close()
        with anyio.move_on_after(timeout):
            while any(q.messages for q in self._queues.values()):
                await self._progress.wait()
        for queue in list(self._queues.values()):
            self._leave(queue)
        return self.stats()

    # -- for the subscriptions ---------------------------------------------------------------

    def _read(self, queue: _Queue) -> None:
        if not queue.full():
            self._notify()

    def _notify(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()

    def _leave(self, queue: _Queue) -> None:
        if self._queues.pop(id(queue), None) is None:
            return
        queue.discard()
        queue.end()
        left = self._left
        left.published += queue.published
        left.delivered += queue.delivered
        left.dropped += queue.dropped
        self._notify()

    def _stall(self, queue: _Queue) -> None:
        queue.stalled = SubscriptionStalled(
            queue.name,
            f"closed after holding the replay {self._stall_limit:g} s without reading "
            f"(its backlog of {queue.backlog} full)",
        )
        queue.wake.set()
        _log.warning(
            "subscription closed: it held the replay without reading",
            subscription=queue.name,
            stall_limit=self._stall_limit,
            backlog=queue.backlog,
        )

    def _stats_of(self, queues: list[_Queue], name: str) -> SinkStats:
        return SinkStats(
            name=name,
            delivery=self._delivery,
            published=sum(q.published for q in queues),
            delivered=sum(q.delivered for q in queues),
            dropped=sum(q.dropped for q in queues),
            pending=sum(len(q.messages) for q in queues),
        )

"""What every sink promises: a delivery mode, one shape of statistics, typed errors.

A sink is given its :class:`Mode` when it is made:

- :attr:`Mode.LIVE`: ``publish()`` never blocks and never waits on a consumer. Each sink has a
  bounded backlog; past it, messages are dropped and counted. The file sink and the in-process
  subscriptions hold at least :data:`LIVE_BACKLOG` messages (10 s at 20 Hz) before dropping, and
  drop the oldest (latest wins). Dropping is logged when it starts and when it stops, with the
  count.
- :attr:`Mode.REPLAY`: nothing is lost. ``publish()`` stays synchronous and never drops; the
  producer applies backpressure by awaiting :meth:`Sink.room` before it produces the next message,
  which returns once the sink's backlog is below its bound. A sink that failed never holds a
  replay (its room is always there); an in-process subscriber that stops reading is closed after a
  bound (see :class:`~pipelines.dms.sinks.memory.Subscriptions`). ZeroMQ never holds one either:
  network subscribers cannot stop the producer (see :class:`~pipelines.dms.sinks.zmq.ZmqSink`).

Every sink counts in one shape, :class:`SinkStats`, and keeps one invariant, exact at every moment:
``published == delivered + dropped + pending``; once the sink is closed (or drained) ``pending``
is 0, so ``dropped == published - delivered``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from aio_runtime import get_logger, loop_caller

from ..config.kinds import Mode
from ..config.values import is_int
from ..messages import DriverStateV2

__all__ = [
    "DRAIN_TIMEOUT",
    "LIVE_BACKLOG",
    "STALL_LIMIT",
    "Mode",
    "CountingSink",
    "DropLog",
    "ReaderClosed",
    "Sink",
    "SinkError",
    "SinkFailed",
    "SinkStats",
    "SubscriptionStalled",
    "Waiters",
    "check_backlog",
]

LIVE_BACKLOG = 200
"""Messages a live file sink or subscription holds before it drops: 10 s at 20 Hz."""
DRAIN_TIMEOUT = 2.0
"""Seconds a closing sink waits for what it holds to be delivered, by default."""
STALL_LIMIT = 10.0
"""Seconds an in-process subscriber may hold a replay without reading before it is closed."""

_log = get_logger(__name__)


@dataclass(frozen=True)
class SinkStats:
    """One sink's counts. ``published == delivered + dropped + pending`` always holds.

    ``delivered``: handed on for good — written to the file or pipe, taken by the subscriber,
    accepted by ZeroMQ into every subscriber's queue. ``pending``: held, not yet delivered (0 once
    the sink is closed). ``failed``: why the sink stopped delivering, if it failed.
    ``closed_by_reader``: standard output was closed by its reader (``| head``) — an end, not a
    failure (``failed`` stays None).
    """

    name: str
    delivery: Mode
    published: int = 0
    delivered: int = 0
    dropped: int = 0
    pending: int = 0
    failed: str | None = None
    closed_by_reader: bool = False


class SinkError(Exception):
    """A sink's delivery ended early, or a subscription was closed. ``sink``: the sink's name."""

    def __init__(self, sink: str, message: str) -> None:
        super().__init__(f"{sink}: {message}")
        self.sink = sink


class SinkFailed(SinkError):
    """The sink could not deliver (a full disk, a broken pipe, a closed file): the run must fail."""


class ReaderClosed(SinkError):
    """Standard output was closed by its reader (``aio-dms run --jsonl - | head``): stop as for a
    signal, not a failure."""


class SubscriptionStalled(SinkError):
    """Raised by a subscription's iterator, in a replay, after it held the replay without reading
    for longer than its bound: it was closed, and what it missed is counted as dropped."""


class Sink(Protocol):
    """What the service asks of every sink."""

    @property
    def name(self) -> str: ...

    @property
    def delivery(self) -> Mode: ...

    def publish(self, message: DriverStateV2) -> None:
        """Take one message; never blocks (a replay's producer awaits :meth:`room` first)."""

    async def room(self) -> None:
        """Return once the backlog is below its bound (at once when live, failed or closed)."""

    def failure(self) -> SinkError | None:
        """Why delivery ended early (:class:`SinkFailed`, :class:`ReaderClosed`), if it did."""

    async def wait_failure(self) -> SinkError | None:
        """Return the failure as soon as there is one, or None once the sink is closed."""

    def stats(self) -> SinkStats: ...

    def endpoint(self) -> tuple[str, str] | None:
        """Where it listens, as bound, if it does: (what it is, its address), e.g. ``("zmq",
        "tcp://127.0.0.1:9031")``."""

    def close(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """Deliver what is held for at most ``timeout`` s (blocking), count the rest dropped."""

    async def aclose(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """:meth:`close` without blocking the event loop."""


def check_backlog(backlog: int, *, what: str = "backlog", unit: str = "messages") -> int:
    """``backlog`` if it is a whole number, at least 1; else :class:`ValueError` saying so."""
    if not is_int(backlog) or backlog < 1:
        raise ValueError(f"{what} must be a whole number of {unit}, at least 1, got {backlog!r}")
    return backlog


class DropLog:
    """Logs a drop episode: a warning when dropping starts, one when it stops, with the count.

    Thread-safe (the file sink drops on its writer thread too)."""

    def __init__(self, sink: str, **context: Any) -> None:
        self._sink = sink
        self._context = context
        self._lock = threading.Lock()
        self._episode = 0

    def dropped(self, count: int = 1, *, why: str) -> None:
        with self._lock:
            starting = self._episode == 0
            self._episode += count
        if starting:
            _log.warning("sink dropping messages", sink=self._sink, why=why, **self._context)

    def delivering(self, *, why: str = "the consumer caught up") -> None:
        """The consumer caught up (the sink says when: its backlog half empty, say, so that a
        consumer hovering at the bound does not start and stop an episode at every message): if
        an episode was on, it ends."""
        if not self._episode:
            return  # the common case, without the lock (a stale read only delays the line)
        with self._lock:
            episode, self._episode = self._episode, 0
        if episode:
            _log.warning(
                "sink stopped dropping", sink=self._sink, dropped=episode, why=why, **self._context
            )


class Waiters:
    """Tasks waiting for a sink's state to change, woken from any thread.

    A task awaits :meth:`until` the state it waits for holds; whoever changes that state calls
    :meth:`wake` after the change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[anyio.Event, Callable[[Callable[[], object]], None]]] = []

    def _event(self) -> anyio.Event:
        event = anyio.Event()
        call = loop_caller()
        with self._lock:
            self._waiting.append((event, call))
        return event

    async def until(self, lock: threading.Lock, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` is true: checked under ``lock`` (the sink's own, held by
        whoever changes what it reads) now, and again after each :meth:`wake`."""
        while True:
            with lock:
                if ready():
                    return
                event = self._event()
            await event.wait()

    def wake(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for event, call in waiting:
            call(event.set)


class CountingSink:
    """The part every sink that counts by itself shares: its name and delivery policy, its counts
    (``published == delivered + dropped + pending``), its first failure, and the tasks waiting
    for it. A subclass counts and fails under :attr:`_lock`, wakes :attr:`_changes` after a
    failure or its end, and says what it holds (:meth:`_pending`) and when its counts are final
    (:meth:`_counts_final`)."""

    def __init__(self, name: str, delivery: Mode) -> None:
        self._name = name
        self._delivery = delivery
        self._published = self._delivered = self._dropped = 0
        self._failure: SinkError | None = None
        self._lock = threading.Lock()
        self._changes = Waiters()

    @property
    def name(self) -> str:
        return self._name

    @property
    def delivery(self) -> Mode:
        return self._delivery

    def failure(self) -> SinkError | None:
        return self._failure

    def endpoint(self) -> tuple[str, str] | None:
        return None

    async def wait_failure(self) -> SinkError | None:
        await self._changes.until(
            self._lock, lambda: self._failure is not None or self._counts_final()
        )
        return self._failure

    def stats(self) -> SinkStats:
        with self._lock:
            reader_closed = isinstance(self._failure, ReaderClosed)
            return SinkStats(
                name=self._name,
                delivery=self._delivery,
                published=self._published,
                delivered=self._delivered,
                dropped=self._dropped,
                pending=self._pending(),
                failed=None if self._failure is None or reader_closed else str(self._failure),
                closed_by_reader=reader_closed,
            )

    def _pending(self) -> int:
        """Messages held, not yet delivered nor dropped (under :attr:`_lock`)."""
        return 0

    def _counts_final(self) -> bool:
        """The counts are final: the sink is closed (under :attr:`_lock`)."""
        return False

"""Where messages go: an in-process subscription for embedding applications, ZeroMQ, JSON lines,
openpilot's own formats (its logs and cereal's ZeroMQ sockets), and a replay's rows as Parquet.

Every sink gets the same :class:`~pipelines.dms.messages.DriverStateV2`; ZeroMQ and JSON lines carry
the same JSON record, the openpilot log and the cereal sockets the same capnp Events (encoded once,
:func:`~pipelines.dms.openpilot.events.events_of`). Each sink is made for a mode
(:class:`~pipelines.dms.config.settings.Mode`: live or replay), and states its policy:

================  ==================================  ==========================================
sink              live                                replay
================  ==================================  ==========================================
Subscriptions     200 per subscriber, oldest dropped  lossless; a subscriber that holds the
                                                      replay 10 s without reading is closed
JsonLinesSink     200 lines, oldest dropped           lossless; the producer waits for room
RlogSink          200 messages, oldest dropped; a     lossless; the producer waits for room
                  message is delivered once it is
                  readable from the file (bz2: at
                  close)
ZmqSink           1000 per subscriber, then sends     the same: network subscribers never hold
                  fail (counted), to all or none;     the producer
                  at most 8 subscribers
CerealSocket      as ZmqSink, one socket (and one     the same
                  sink) per service: driverStateV2
                  on port 45495, dmsStatus on 53156
ParquetSink       (replays only)                      lossless; the producer waits for room; a
                                                      row is delivered once its row group is
                                                      written, the file complete only once the
                                                      replay has ended by itself
================  ==================================  ==========================================

No sink's ``publish`` blocks. Every sink counts in one shape (:class:`~.base.SinkStats`, with
``published == delivered + dropped + pending``, ``pending`` 0 once closed) and reports a failure
(:class:`~.base.SinkFailed`; standard output closed by its reader: :class:`~.base.ReaderClosed`).
The kinds a setting turns on are the table :data:`pipelines.dms.sinks.SINKS`.

:class:`Sinks` drives several together — what a service calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import anyio

from ..messages import DriverStateV2
from .base import DRAIN_TIMEOUT, Sink, SinkError, SinkStats

__all__ = ["Sinks"]


class Sinks:
    """Several sinks driven as one: publish to all, wait for room in all, learn the first
    failure, close all within one bound."""

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self._sinks: list[Sink] = list(sinks)

    def add(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def __iter__(self) -> Iterator[Sink]:
        """The sinks, in the order they were added."""
        return iter(self._sinks)

    def publish(self, message: DriverStateV2) -> None:
        for sink in self._sinks:
            sink.publish(message)

    async def room(self) -> None:
        """Return once every sink has room (at once for live sinks)."""
        for sink in self._sinks:
            await sink.room()

    async def wait_failure(self) -> SinkError | None:
        """The first sink failure as soon as it happens; None once every sink closed without."""
        found: list[SinkError] = []
        async with anyio.create_task_group() as tg:

            async def watch(sink: Sink) -> None:
                failure = await sink.wait_failure()
                if failure is not None:
                    found.append(failure)
                    tg.cancel_scope.cancel()

            for sink in self._sinks:
                tg.start_soon(watch, sink)
        return found[0] if found else None

    def stats(self) -> list[SinkStats]:
        return [sink.stats() for sink in self._sinks]

    async def aclose(self, timeout: float = DRAIN_TIMEOUT) -> list[SinkStats]:
        """Close every sink at once, each draining for at most ``timeout`` seconds."""
        async with anyio.create_task_group() as tg:
            for sink in self._sinks:
                tg.start_soon(sink.aclose, timeout)
        return self.stats()

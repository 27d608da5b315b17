"""Where messages go: an in-process subscription for embedding applications, ZeroMQ PUB, JSON lines.

Every sink gets the same :class:`~pipelines.dms.messages.DriverStateV2`; ZeroMQ and JSON lines carry
the same JSON record. Nothing here blocks the event loop or waits on a consumer:

- :class:`Subscriptions`: each subscriber has a bounded backlog; a subscriber that falls behind
  loses its oldest messages, counted (``dropped``), and its stream says so — the ``seq`` numbers
  show the gap too.
- :class:`ZmqSink`: a PUB socket, bound to loopback unless told otherwise (design C9); topic
  ``driverStateV2``, multipart ``[topic, json]``. Sends never block: past the high-water mark
  ZeroMQ drops (counted). A late subscriber misses earlier messages (ZeroMQ's slow joiner); the
  sequence numbers make that visible.
- :class:`JsonLinesSink`: one JSON record per line to a file or stdout, flushed per line.
"""

from __future__ import annotations

import ipaddress
import queue
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import urlsplit

import anyio
import zmq

from aio_runtime import get_logger

from .messages import DriverStateV2

__all__ = ["JsonLinesSink", "Sink", "Subscriptions", "ZmqSink"]

TOPIC = b"driverStateV2"
_log = get_logger(__name__)


class Sink(Protocol):
    def publish(self, message: DriverStateV2) -> None: ...

    def close(self) -> None: ...


class _Subscriber:
    def __init__(self, backlog: int) -> None:
        self.queue: deque[DriverStateV2] = deque(maxlen=backlog)
        self.dropped = 0
        self.wake = anyio.Event()


class Subscriptions:
    """In-process fan-out. ``async for message in subscriptions.subscribe(): ...``"""

    def __init__(self) -> None:
        self._subscribers: set[_Subscriber] = set()
        self._closed = False

    def publish(self, message: DriverStateV2) -> None:
        for subscriber in self._subscribers:
            if len(subscriber.queue) == subscriber.queue.maxlen:
                subscriber.dropped += 1  # the oldest goes: latest wins
            subscriber.queue.append(message)
            subscriber.wake.set()

    async def subscribe(self, *, backlog: int = 64) -> AsyncIterator[DriverStateV2]:
        """Messages from now on, until the publisher closes. ``backlog``: how many may wait
        unread before the oldest is dropped."""
        if backlog < 1:
            raise ValueError(f"backlog must be at least 1, got {backlog}")
        subscriber = _Subscriber(backlog)
        self._subscribers.add(subscriber)
        try:
            while True:
                while subscriber.queue:
                    yield subscriber.queue.popleft()
                if self._closed:
                    return
                subscriber.wake = anyio.Event()
                await subscriber.wake.wait()
        finally:
            self._subscribers.discard(subscriber)

    def close(self) -> None:
        self._closed = True
        for subscriber in self._subscribers:
            subscriber.wake.set()


def _loopback(address: str) -> bool:
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ZmqSink:
    """ZeroMQ PUB on ``address`` (default ``tcp://127.0.0.1:9031``). An address that is not
    loopback is refused unless ``allow_remote`` (C9)."""

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:9031",
        *,
        allow_remote: bool = False,
        high_water_mark: int = 10_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        if not _loopback(address) and not allow_remote:
            raise ValueError(
                f"refusing to publish on {address}: not a loopback address (pass allow_remote "
                "to publish beyond this machine)"
            )
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        """The bound endpoint (with the port chosen, if ``:0``... was asked for)."""
        self.sent = 0
        self.dropped = 0

    def publish(self, message: DriverStateV2) -> None:
        try:
            self._socket.send_multipart([TOPIC, message.to_json().encode()], flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1  # past the high-water mark: ZeroMQ drops, we count

    def close(self) -> None:
        self._socket.close(linger=0)


class JsonLinesSink:
    """One JSON record per line, to ``path`` (``"-"``: standard output).

    Writing happens on a worker thread of its own, so a slow or stalled reader (a full pipe) never
    blocks the event loop: up to ``backlog`` lines wait, and past that the newest are dropped and
    counted (``dropped``). A write that fails (a broken pipe, a full disk) ends this sink — logged
    and counted in ``failed`` — never the service."""

    def __init__(self, path: str | Path, *, backlog: int = 1000) -> None:
        self._stream: IO[str]
        if str(path) == "-":
            self._stream, self._owned = sys.stdout, False
        else:
            self._stream, self._owned = open(path, "a", encoding="utf-8"), True
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=backlog)
        self.written = 0
        self.dropped = 0
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._write_lines, name="jsonl sink", daemon=True)
        self._thread.start()

    def publish(self, message: DriverStateV2) -> None:
        if self.failed is not None:
            self.dropped += 1
            return
        try:
            self._lines.put_nowait(message.to_json() + "\n")
        except queue.Full:
            self.dropped += 1

    def _write_lines(self) -> None:
        for line in iter(self._lines.get, None):
            if self.failed is not None:
                continue
            try:
                self._stream.write(line)
                self._stream.flush()
                self.written += 1
            except (OSError, ValueError) as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
                _log.error("jsonl sink failed", error=self.failed)

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds), then close the file."""
        try:
            self._lines.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._owned and not self._thread.is_alive():
            try:
                self._stream.close()
            except OSError as exc:  # what could not be written is already counted as failed
                self.failed = self.failed or f"{type(exc).__name__}: {exc}"

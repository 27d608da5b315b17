"""The ZeroMQ sink: multipart ``[b"driverStateV2", json]`` on an XPUB socket (SUB sockets connect).

Sends never block, whatever the delivery mode: a replay is never held by network subscribers
(:meth:`ZmqSink.room` returns at once). What cannot be sent is counted, exactly:

- The socket is an XPUB with ``ZMQ_XPUB_NODROP``: a send that would pass a subscriber's
  high-water mark fails (``zmq.Again`` under ``NOBLOCK``) and is counted as dropped. libzmq checks
  every matching subscriber before it sends (``dist_t::check_hwm``), so a message goes to all of
  them or to none: **while one subscriber is stalled with its queue full, no subscriber receives
  messages** — a healthy one beside it sees the same gaps in ``seq``. In exchange the count is
  exact for every subscriber: each one that stayed connected received ``delivered`` messages
  (``published - dropped``), in order. Dropping is logged when it starts and when it stops.
- ``delivered`` means accepted into every subscriber's queue (with no subscriber at all, a
  message counts as delivered to none of them). A subscriber that disconnects loses what its
  queue held; a subscriber that joins late misses what came before (ZeroMQ's slow joiner). Both
  show as gaps in ``seq``.
- Memory: each subscriber's queue holds at most ``high_water_mark`` messages. Since every
  message goes to all subscribers or to none, every queue holds the newest part of one and the
  same stream, and the message bodies are shared (libzmq counts references): the publisher holds
  at most ``high_water_mark`` bodies however many subscribers stall, plus ~110 bytes per queued
  message per subscriber, plus ``SO_SNDBUF`` (:data:`SEND_BUFFER`, 128 KiB) of kernel memory per
  connection. A message is ~1-1.5 KB of JSON. Measured (``python -m benchmarks.zmq_memory``,
  1.5 KB messages, the defaults): 1.4 MB for one stalled subscriber, 2.2 MB for eight. The
  number of subscribers is capped all the same (connections cost file descriptors, kernel
  buffers and that overhead): ``max_subscribers`` are admitted — of a burst connecting at once,
  the first ``max_subscribers`` through the handshake — and one past them is refused in
  ZeroMQ's handshake: a ZAP handler answers 400, and libzmq sends the subscriber an ERROR
  command with that code, which its socket's monitor reports as
  ``ZMQ_EVENT_HANDSHAKE_FAILED_AUTH`` with value 400 (ZMTP's NULL mechanism carries the code,
  not the reply's text); it receives nothing, and libzmq 4.3 does not retry it. Each refusal is
  logged (``zmq subscriber refused``, with the peer's address) and counted
  (:attr:`ZmqSink.refused`). A subscriber that leaves frees its place. The cap covers
  ``tcp://`` and ``ipc://``; ``inproc://`` peers are the embedding application's own and have
  no handshake.

Addresses are checked up front (:func:`check_zmq_address`): the form, a port of 0-65535 (0 or ``*``:
any free one), and the loopback rule (design C9: refused unless ``allow_remote``); a bad one is a
:class:`ValueError` in one line. An address in use is :class:`AddressInUse`, an :class:`OSError`
(``errno.EADDRINUSE``) naming it.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

import anyio.to_thread
import zmq

from aio_runtime import get_logger

from ..config.kinds import Mode
from ..config.values import check_zmq_address
from ..messages import DriverStateV2
from .base import DRAIN_TIMEOUT, CountingSink, DropLog, SinkFailed, SinkStats, check_backlog
from .zmq_gate import SubscriberGate

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from . import Rows

__all__ = [
    "DEFAULT_ADDRESS",
    "HIGH_WATER_MARK",
    "MAX_SUBSCRIBERS",
    "SEND_BUFFER",
    "TOPIC",
    "AddressInUse",
    "ZmqSink",
    "check_zmq_address",
    "open_sinks",
]

TOPIC = b"driverStateV2"
DEFAULT_ADDRESS = "tcp://127.0.0.1:9031"
HIGH_WATER_MARK = 1000
"""Messages queued per subscriber before sends fail: 50 s at 20 Hz (~1.4 MB, measured)."""
SEND_BUFFER = 128 * 1024
"""The kernel's send buffer per connection (bytes), fixed so the bound does not autotune."""
MAX_SUBSCRIBERS = 8

_log = get_logger(__name__)


class AddressInUse(OSError):
    """Something already listens on the address."""


class ZmqSink(CountingSink):
    """ZeroMQ on ``address`` (see the module's description for the policy and its bounds)."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        delivery: Mode = Mode.LIVE,
        allow_remote: bool = False,
        high_water_mark: int = HIGH_WATER_MARK,
        max_subscribers: int = MAX_SUBSCRIBERS,
        name: str | None = None,
    ) -> None:
        check_zmq_address(address, allow_remote=allow_remote)
        check_backlog(high_water_mark, what="high_water_mark")
        check_backlog(max_subscribers, what="max_subscribers", unit="subscribers")
        super().__init__(name or f"zmq {address}", delivery)
        self._high_water_mark = high_water_mark
        self._sent_in_a_row = 0
        self._closed = False
        self._drops = DropLog(self._name, high_water_mark=high_water_mark)
        self._context = zmq.Context(io_threads=1)
        self._socket: zmq.Socket[bytes] = self._context.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.XPUB_NODROP, 1)
        self._socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self._socket.setsockopt(zmq.SNDBUF, SEND_BUFFER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.ZAP_DOMAIN, b"dms")
        if address.startswith("tcp://["):
            self._socket.setsockopt(zmq.IPV6, 1)  # only then: it would turn IPv4 endpoints to
            # IPv4-mapped IPv6 ones (tcp://[::ffff:127.0.0.1]:...), which IPv4 peers cannot use
        self._gate = SubscriberGate(self._context, self._socket, max_subscribers, self._name)
        try:
            self._socket.bind(address)
        except zmq.ZMQError as exc:
            self._shut(0)
            self._context.term()
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(exc.errno, f"zmq {address}: address already in use") from None
            raise ValueError(f"zmq {address}: cannot bind: {exc.strerror}") from None
        self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        """The bound endpoint (with the port chosen, if ``:0`` was asked for)."""

    def endpoint(self) -> tuple[str, str]:
        return ("zmq", self.address)

    @property
    def subscribers(self) -> int:
        """Live connections (``tcp://``, ``ipc://``): the admitted ones, and those still in
        their handshake or being refused."""
        return self._gate.connections

    @property
    def refused(self) -> int:
        """Connections refused at the cap so far."""
        return self._gate.refused

    def publish(self, message: DriverStateV2) -> None:
        frames = self._frames(message)
        if frames is None:
            return  # nothing of this socket's: not published here
        self._published += 1
        if self._failure is not None or self._closed:
            self._dropped += 1
            return
        self._read_subscriptions()
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._dropped += 1
            self._sent_in_a_row = 0
            self._drops.dropped(why="a subscriber's queue is full: no subscriber gets this one")
            return
        except zmq.ZMQError as exc:
            self._dropped += 1
            with self._lock:
                self._failure = SinkFailed(self._name, f"send failed: {exc.strerror}")
            _log.error("sink failed", sink=self._name, error=str(self._failure))
            self._changes.wake()
            return
        self._delivered += 1
        self._sent_in_a_row += 1
        if self._sent_in_a_row >= self._high_water_mark:  # a whole queue's worth got through
            self._drops.delivering(why="every subscriber reads again")

    def _frames(self, message: DriverStateV2) -> list[bytes] | None:
        """The frames of one ZeroMQ message that carry ``message`` (None: this socket sends
        nothing for it): here the topic and the JSON record."""
        return [TOPIC, message.to_json().encode()]

    def _read_subscriptions(self) -> None:
        """Subscriptions arrive as messages on an XPUB socket: read them so none pile up."""
        while True:
            try:
                self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    async def room(self) -> None:
        return  # network subscribers never hold the producer

    def _counts_final(self) -> bool:
        return self._closed

    def close(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """Send what the queues hold for at most ``timeout`` seconds (blocking), then close.
        (What a subscriber has not received by then is lost with it, as on a disconnect.)"""
        if self._stop_sending(timeout):
            self._context.term()  # waits for the queues to be sent, or the linger to pass
        return self.stats()

    async def aclose(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """:meth:`close`, the wait for the queues on a worker thread (the socket itself is
        closed here, on the loop that publishes: a ZeroMQ socket belongs to one thread)."""
        if self._stop_sending(timeout):
            await anyio.to_thread.run_sync(self._context.term)
        return self.stats()

    def _stop_sending(self, timeout: float) -> bool:
        """Close the socket (the first time: True) with ``timeout`` to send what is queued."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self._drops.delivering(why="closed")
        self._shut(int(timeout * 1000))
        self._changes.wake()
        return True

    def _shut(self, linger_ms: int) -> None:
        self._gate.stop()
        self._socket.close(linger=linger_ms)


def open_sinks(config: ServiceConfig, rows: Rows) -> list[ZmqSink]:
    """The sink ``--zmq`` asks for, bound."""
    assert config.zmq is not None
    return [ZmqSink(config.zmq, delivery=config.mode, allow_remote=config.allow_remote)]

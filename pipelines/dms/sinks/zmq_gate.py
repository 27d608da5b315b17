"""The ZeroMQ sink's subscriber cap (:class:`SubscriberGate`): a thread that answers ZeroMQ's
authentication requests (ZAP) for the sink's socket, admitting at most so many subscribers, and
follows its connections on the socket's monitor."""

from __future__ import annotations

import contextlib
import itertools
import threading

import zmq
from zmq.utils.monitor import parse_monitor_message

from aio_runtime import get_logger

__all__ = ["SubscriberGate"]

_log = get_logger(__name__)
_ZAP = "inproc://zeromq.zap.01"
_gates = itertools.count()
_STOP_WAIT = 5.0
"""Seconds to wait for the gate's thread to stop (it wakes at once when told)."""
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
"""A handshake that failed in the engine: sent just before that connection's DISCONNECTED. (A
refusal's HANDSHAKE_FAILED_AUTH is sent as the refusal is read, its DISCONNECTED only once the
subscriber has closed.)"""
_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)


class SubscriberGate:
    """Caps the subscribers: a thread that answers ZeroMQ's authentication requests (ZAP) and
    follows the connections on the socket's monitor.

    A slot is taken when a request is answered 200 (at most ``limit`` taken: in a burst, the
    first ``limit`` requests answered are admitted, whatever order the monitor's events arrive
    in) and given back when that connection ends. libzmq 4.3 does not say which connection a
    request or a handshake event belongs to (the request carries the peer's IP address only, a
    handshake event no file descriptor); a connection's ``ACCEPTED`` and ``DISCONNECTED`` carry
    its descriptor, and a failed handshake's event comes just before its ``DISCONNECTED``. So
    the gate counts the live connections by what it knows of them — not yet answered,
    admitted and still in its handshake, admitted and connected, refused and not yet gone —
    and gives an ending to the kind it must be of; where two kinds fit, to the one that frees
    no slot (a slot is then freed a moment late, never early). A connection admitted whose
    handshake then fails frees its slot. Whatever was guessed is put right as soon as the live
    connections' number shows it: there are never fewer live connections than the ones
    counted."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        socket: zmq.Socket[bytes],
        limit: int,
        sink: str,
    ) -> None:
        self._limit = limit
        self._sink = sink
        self._live: set[int] = set()
        """The descriptors of the live connections (the monitor's ``ACCEPTED``, less its
        ``DISCONNECTED``)."""
        self._handshaking = 0
        """Admitted, handshake not yet complete."""
        self._connected = 0
        """Admitted, handshake complete."""
        self._refusing = 0
        """Refused, not yet gone (the subscriber closes on the refusal)."""
        self._failing = False
        """The last event was a failed handshake: the next ``DISCONNECTED`` is its end."""
        self.refused = 0
        self._zap = context.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(_ZAP)
        self._monitor = socket.get_monitor_socket(_EVENTS)
        stop = f"inproc://dms-gate-stop-{next(_gates)}"
        self._stop_in = context.socket(zmq.PAIR)
        self._stop_in.bind(stop)
        self._stop_out = context.socket(zmq.PAIR)
        self._stop_out.connect(stop)
        self._thread = threading.Thread(target=self._serve, name=f"{sink} gate", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._live)

    @property
    def admitted(self) -> int:
        """Slots taken: admitted connections not yet gone."""
        return self._handshaking + self._connected

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(zmq.ZMQError):
                self._stop_out.send(b"", zmq.NOBLOCK)
            self._thread.join(_STOP_WAIT)
        self._stop_out.close(linger=0)

    def _serve(self) -> None:
        poller = zmq.Poller()
        for socket in (self._zap, self._monitor, self._stop_in):
            poller.register(socket, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_in in ready:
                    return
                request = self._request() if self._zap in ready else None
                # A connection's ACCEPTED is sent before its request: read after the request,
                # the monitor has it.
                self._follow_connections()
                if request is not None:
                    self._answer(request)
        except zmq.ContextTerminated:
            return
        finally:
            for socket in (self._zap, self._monitor, self._stop_in):
                socket.close(linger=0)

    def _request(self) -> list[bytes] | None:
        try:
            return self._zap.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None

    @property
    def _unanswered(self) -> int:
        return len(self._live) - self._handshaking - self._connected - self._refusing

    def _follow_connections(self) -> None:
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            kind, value = event["event"], int(event["value"])  # a descriptor, or an errno
            failing, self._failing = self._failing, kind in _HANDSHAKE_FAILED
            if kind == zmq.EVENT_ACCEPTED:
                self._live.add(value)
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if self._handshaking:
                    self._handshaking -= 1
                self._connected += 1
            elif kind == zmq.EVENT_DISCONNECTED and value in self._live:
                self._ended(failed_handshake=failing)
                self._live.discard(value)
            self._put_right()

    def _ended(self, *, failed_handshake: bool) -> None:
        """One live connection ended: count it off the kind it is of (see the class)."""
        if failed_handshake:  # not answered, refused before its READY, or admitted
            if self._unanswered > 0:
                return
            if self._refusing:
                self._refusing -= 1
            elif self._handshaking:
                self._handshaking -= 1
            elif self._connected:
                self._connected -= 1
        elif self._refusing:  # refused, or connected
            self._refusing -= 1
        elif self._connected:
            self._connected -= 1
        elif self._handshaking:
            self._handshaking -= 1

    def _put_right(self) -> None:
        """Fewer live connections than counted: those counted in excess are gone (first the
        refused, which free no slot)."""
        excess = -self._unanswered
        while excess > 0:
            if self._refusing:
                self._refusing -= 1
            elif self._handshaking:
                self._handshaking -= 1
            else:
                self._connected -= 1
            excess -= 1

    def _answer(self, request: list[bytes]) -> None:
        # A ZAP request: version, request id, domain, peer address, routing id, mechanism, ...
        version, request_id, peer = request[0], request[1], request[3]
        if self.admitted < self._limit:
            self._handshaking += 1
            self._zap.send_multipart([version, request_id, b"200", b"OK", b"", b""])
            return
        self.refused += 1
        self._refusing += 1
        _log.warning(
            "zmq subscriber refused",
            sink=self._sink,
            peer=peer.decode(errors="replace"),
            max_subscribers=self._limit,
        )
        text = f"at most {self._limit} subscribers".encode()
        self._zap.send_multipart([version, request_id, b"400", text, b"", b""])

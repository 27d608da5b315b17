"""cereal's ZeroMQ rule: each service's Events on its own PUB socket, on the port its name gives,
so that openpilot's messaging (``SubMaster(['driverStateV2'])`` with ``ZMQ=1``) and its bridge
subscribe to us as to one of its own processes.

One socket per service: ``driverStateV2`` (a frame's model outputs) and ``dmsStatus`` (our
status, carried in cereal's ``customReserved0``; every message has one), each bound on
``tcp://HOST:PORT`` with PORT = :func:`cereal_port` of the service's name (FNV-1a 64-bit of its
bytes, modulo 65535 - 8023, plus 8023, as openpilot's ``msgq`` does): **45495** for
``driverStateV2``, **53156** for ``dmsStatus``. Each Event's bytes go out as one ZeroMQ frame, no
topic frame (subscribers subscribe to everything). HOST is 127.0.0.1 unless given, and a host
beyond this machine only with ``allow_remote`` (design C9).

Each socket is a :class:`~.zmq.ZmqSink` and keeps its policy, whatever the mode: sends
never block and never hold a replay; a send that would pass a subscriber's high-water mark (1000
messages) is dropped and counted, exactly (a message reaches every subscriber or none); at most 8
subscribers; a port in use is :class:`~.zmq.AddressInUse`, in one line. Each socket counts
as a sink of its own: ``published`` is the messages that had an Event of its service (the
``driverStateV2`` socket skips the status messages of a stalled camera, which have none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.kinds import Mode
from ..messages import DriverStateV2
from ..openpilot.events import DRIVER_STATE, STATUS, events_of
from .zmq import HIGH_WATER_MARK, MAX_SUBSCRIBERS, ZmqSink

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from . import Rows

__all__ = [
    "CEREAL_SERVICES",
    "DEFAULT_HOST",
    "CerealSocket",
    "cereal_address",
    "cereal_port",
    "open_cereal_sockets",
    "open_sinks",
]

CEREAL_SERVICES = (DRIVER_STATE, STATUS)
"""The services published, each on its own socket."""
DEFAULT_HOST = "127.0.0.1"

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_FIRST_PORT = 8023
_LAST_PORT = 65535


def cereal_port(service: str) -> int:
    """The port openpilot's ZeroMQ messaging gives ``service``: 8023 + FNV-1a-64(name) mod
    (65535 - 8023). ``driverStateV2``: 45495."""
    value = _FNV_OFFSET
    for byte in service.encode():
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
    return _FIRST_PORT + value % (_LAST_PORT - _FIRST_PORT)


def cereal_address(service: str, host: str = DEFAULT_HOST) -> str:
    """``tcp://HOST:PORT`` for ``service`` on ``host`` (an IPv6 host in brackets)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{shown}:{cereal_port(service)}"


class CerealSocket(ZmqSink):
    """One service's PUB socket: the message's Event of ``service``, as one frame."""

    def __init__(
        self,
        service: str,
        host: str = DEFAULT_HOST,
        *,
        delivery: Mode = Mode.LIVE,
        allow_remote: bool = False,
        high_water_mark: int = HIGH_WATER_MARK,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        if service not in CEREAL_SERVICES:
            raise ValueError(
                f"cereal service must be one of {list(CEREAL_SERVICES)}, got {service!r}"
            )
        address = cereal_address(service, host)
        self.service = service
        super().__init__(
            address,
            delivery=delivery,
            allow_remote=allow_remote,
            high_water_mark=high_water_mark,
            max_subscribers=max_subscribers,
            name=f"cereal {service} {address}",
        )

    def endpoint(self) -> tuple[str, str]:
        return (f"cereal {self.service}", self.address)

    def _frames(self, message: DriverStateV2) -> list[bytes] | None:
        for member, event in events_of(message):
            if member == self.service:
                return [event]
        return None


def open_cereal_sockets(
    host: str = DEFAULT_HOST, *, delivery: Mode = Mode.LIVE, allow_remote: bool = False
) -> list[CerealSocket]:
    """A bound socket for each of :data:`CEREAL_SERVICES` on ``host``; the first that cannot be
    bound raises (:class:`~.zmq.AddressInUse`, :class:`ValueError`) with those bound before
    it closed."""
    sockets: list[CerealSocket] = []
    try:
        for service in CEREAL_SERVICES:
            sockets.append(
                CerealSocket(service, host, delivery=delivery, allow_remote=allow_remote)
            )
    except BaseException:
        for socket in sockets:
            socket.close(0)
        raise
    return sockets


def open_sinks(config: ServiceConfig, rows: Rows) -> list[CerealSocket]:
    """The sockets ``--cereal-zmq`` asks for, bound."""
    assert config.cereal_zmq is not None
    return open_cereal_sockets(
        config.cereal_zmq, delivery=config.mode, allow_remote=config.allow_remote
    )

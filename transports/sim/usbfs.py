"""A simulated bridge as a Linux usbfs device file (``/dev/bus/usb/BBB/DDD``): what the usbdevfs
ioctls that libusb issues on an open file do, and the kernel's side of their ABI (values as in
``linux/usbdevice_fs.h``, and, for the setup packet and the descriptor request, chapter 9 of the
USB specification). :class:`~transports.sim.umockdev.EmulatedBridge` puts a :class:`UsbfsDevice`
behind an emulated node.

The ioctls arrive on the emulation's own thread. What each does:

- ``SUBMITURB``: read the URB (and, for OUT, its data) from the client, hand a ``SimUrb`` to the
  bridge on the simulation's thread; the URB's completion (on that thread) queues it for reaping.
  Standard GET_DESCRIPTOR requests are answered here, from the emulated descriptors.
- ``REAPURBNDELAY``: hand out one finished URB — status (completed 0, stall ``-EPIPE``, no device
  ``-ENODEV``, cancelled ``-ENOENT``), actual length, IN data copied into the client's buffer — or
  ``EAGAIN`` when none has finished.
- ``DISCARDURB``: a URB still in flight is discarded on the bridge and reaped with ``-ENOENT``; one
  that has already finished (or is unknown) gets ``EINVAL``, as from the kernel.
- ``RESET`` resets the bridge; ``CLAIMINTERFACE``/``RELEASEINTERFACE`` (interface 0),
  ``SETCONFIGURATION`` (1), ``SETINTERFACE`` (0, 0), ``CLEAR_HALT`` succeed; ``GET_CAPABILITIES``
  announces unlimited URB sizes (one libusb transfer is one URB is one bridge transfer) and reaping
  after a disconnect; ``GETDRIVER`` and ``USBDEVFS_IOCTL`` say no driver is bound (``ENODATA``).
  Anything else (the synchronous ``CONTROL``/``BULK`` ioctls, which libusb does not use) is
  ``ENOTTY``.

A URB that ends with no device (the bridge left the bus) ends that open file for good, as an unplug
ends a real usbfs file: from then on every ioctl on it fails with ``ENODEV`` (reaping first hands
out the URBs that had finished). A new open is the device after it re-enumerated, and talks to the
bridge again (which fails it at once while the bridge's disconnect rule is still active). The node
itself stays: the emulation is not told when the bridge is back on the bus.
"""

from __future__ import annotations

import enum
import errno
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .bridge import SimBridge
from .urb import SimUrb, UrbStatus

__all__ = ["Ioctl", "Server", "UsbfsDevice", "urb_status"]


class Ioctl(enum.IntEnum):
    """usbdevfs ioctl numbers (type 'U'); matched on the number alone, so size and direction bits
    of either ABI variant match."""

    SETINTERFACE = 4
    SETCONFIGURATION = 5
    GETDRIVER = 8
    SUBMITURB = 10
    DISCARDURB = 11
    REAPURB = 12
    REAPURBNDELAY = 13
    CLAIMINTERFACE = 15
    RELEASEINTERFACE = 16
    IOCTL = 18
    RESET = 20
    CLEAR_HALT = 21
    GET_CAPABILITIES = 26
    DISCONNECT_CLAIM = 27
    GET_SPEED = 31


_CAP_NO_PACKET_SIZE_LIM, _CAP_REAP_AFTER_DISCONNECT = 0x04, 0x10
_USB_SPEED_HIGH, _USB_SPEED_SUPER = 3, 5

_URB_SIZE = 56
"""struct usbdevfs_urb on x86_64 (no iso packets)."""
_URB_HEAD = struct.Struct("<BBxxiI4xQii")
"""type, endpoint, status, flags, buffer, length, actual."""
_URB_STATUS, _URB_BUFFER, _URB_ACTUAL = 4, 16, 28
"""Offsets in the URB of its status, its buffer pointer and its actual length."""
_URB_TYPE_CONTROL = 2
_SETUP = struct.Struct("<BBHHH")
"""A control transfer's setup packet: request type, request, value, index, length."""
_STANDARD_IN, _GET_DESCRIPTOR = 0x80, 6
"""The standard request a host reads descriptors with."""

_STATUS = {
    UrbStatus.COMPLETED: 0,
    UrbStatus.STALL: -errno.EPIPE,
    UrbStatus.NO_DEVICE: -errno.ENODEV,
    UrbStatus.CANCELLED: -errno.ENOENT,
}


def urb_status(status: UrbStatus | None) -> int:
    """The usbfs status a finished URB is reaped with."""
    return -errno.EPROTO if status is None else _STATUS[status]


class Server(Protocol):
    """Runs ``fn(*args)`` on the simulation's thread, soon (as
    :class:`~transports.sim.server.SimServer` does)."""

    def call(self, fn: Any, *args: Any) -> None: ...


@dataclass
class _Urb:
    """A URB between submit and reap: the client's struct (and buffer) and the bridge's view."""

    struct_data: Any
    buffer: Any | None
    length: int
    sim: SimUrb
    control: bool


@dataclass
class _Connection:
    """One open file of the device node (one libusb device handle)."""

    client: Any
    in_flight: dict[int, _Urb] = field(default_factory=dict)
    finished: deque[int] = field(default_factory=deque)
    """Client addresses of finished URBs, in completion order (appended on the sim thread)."""
    gone: bool = False
    """The device left the bus while this file was open: it stays dead."""


class UsbfsDevice:
    """``bridge``, running in ``server``, behind the open files of one device node.

    ``descriptors`` (device, then configuration) and ``strings`` (by index) answer the standard
    descriptor requests; ``superspeed`` is what ``GET_SPEED`` reports.
    """

    def __init__(
        self,
        server: Server,
        bridge: SimBridge,
        *,
        descriptors: bytes,
        strings: Mapping[int, bytes],
        superspeed: bool,
    ) -> None:
        self.server = server
        self.bridge = bridge
        self.descriptors = descriptors
        self.strings = dict(strings)
        self.superspeed = superspeed
        self.ioctls = 0
        """How many ioctls the device has answered (reap polls included)."""
        self.discards = 0
        """How many URBs in flight the host has discarded."""
        self._connections: dict[int, _Connection] = {}
        self._lock = threading.Lock()
        self._ioctls: dict[int, Callable[[Any, _Connection], int]] = {
            Ioctl.SUBMITURB: self._submit,
            Ioctl.DISCARDURB: self._discard,
            Ioctl.GET_CAPABILITIES: self._capabilities,
            Ioctl.CLAIMINTERFACE: self._interface,
            Ioctl.RELEASEINTERFACE: self._interface,
            Ioctl.DISCONNECT_CLAIM: self._interface,
            Ioctl.SETCONFIGURATION: self._configuration,
            Ioctl.SETINTERFACE: self._alternate_setting,
            Ioctl.GETDRIVER: self._no_driver,
            Ioctl.IOCTL: self._no_driver,
            Ioctl.RESET: self._reset,
            Ioctl.CLEAR_HALT: self._clear_halt,
            Ioctl.GET_SPEED: self._speed,
        }

    def close(self) -> None:
        """Forget every open file."""
        with self._lock:
            self._connections.clear()

    # -- the ioctls (the emulation's thread) ---------------------------------------------------

    def _connection(self, client: Any) -> _Connection:
        key = hash(client)  # the GObject's address: stable across calls, unlike the wrapper
        with self._lock:
            connection = self._connections.get(key)
            if connection is None:
                self._prune()
                connection = self._connections[key] = _Connection(client)
            return connection

    def _prune(self) -> None:
        """Forget closed files."""
        for key in [k for k, c in self._connections.items() if not c.client.get_connected()]:
            del self._connections[key]

    def handle(self, client: Any) -> bool:
        """Answer one ioctl (an umockdev ``IoctlClient``); always handled."""
        self.ioctls += 1
        request = client.get_request()
        if (request >> 8) & 0xFF != ord("U"):
            client.complete(-1, errno.ENOTTY)
            return True
        number = request & 0xFF
        connection = self._connection(client)
        try:
            result = self._dispatch(number, client, connection)
        except OSError as exc:
            client.complete(-1, exc.errno or errno.EIO)
        else:
            client.complete(result, 0)
        return True

    def _dispatch(self, number: int, client: Any, connection: _Connection) -> int:
        if number in (Ioctl.REAPURB, Ioctl.REAPURBNDELAY):  # REAPURB (blocking): never from libusb
            return self._reap(client, connection)
        if connection.gone:
            raise OSError(errno.ENODEV, "the device left the bus")
        handler = self._ioctls.get(number)
        if handler is None:
            raise OSError(errno.ENOTTY, f"usbdevfs ioctl {number} is not emulated")
        return handler(client, connection)

    def _capabilities(self, client: Any, _connection: _Connection) -> int:
        self._write_u32(client, _CAP_NO_PACKET_SIZE_LIM | _CAP_REAP_AFTER_DISCONNECT)
        return 0

    def _interface(self, client: Any, _connection: _Connection) -> int:
        return self._expect(client, 0, "interface")

    def _configuration(self, client: Any, _connection: _Connection) -> int:
        return self._expect(client, 1, "configuration")

    def _alternate_setting(self, client: Any, _connection: _Connection) -> int:
        if self._read(client, 8) != bytes(8):
            raise OSError(errno.EINVAL, "only interface 0, alternate setting 0")
        return 0

    @staticmethod
    def _no_driver(_client: Any, _connection: _Connection) -> int:
        raise OSError(errno.ENODATA, "no kernel driver is bound")

    def _reset(self, _client: Any, _connection: _Connection) -> int:
        self.server.call(self.bridge.reset)
        return 0

    @staticmethod
    def _clear_halt(_client: Any, _connection: _Connection) -> int:
        return 0

    def _speed(self, _client: Any, _connection: _Connection) -> int:
        return _USB_SPEED_SUPER if self.superspeed else _USB_SPEED_HIGH

    @staticmethod
    def _read(client: Any, size: int) -> bytes:
        return bytes(client.get_arg().resolve(0, size).retrieve())

    @staticmethod
    def _write_u32(client: Any, value: int) -> None:
        client.get_arg().resolve(0, 4).update(0, struct.pack("<I", value))

    def _expect(self, client: Any, wanted: int, what: str) -> int:
        (value,) = struct.unpack("<I", self._read(client, 4))
        if value != wanted:
            raise OSError(errno.EINVAL, f"no {what} {value}")
        return 0

    def _submit(self, client: Any, connection: _Connection) -> int:
        urb_data = client.get_arg().resolve(0, _URB_SIZE)
        kind, endpoint, _, _, _, length, _ = _URB_HEAD.unpack_from(bytes(urb_data.retrieve()))
        buffer = urb_data.resolve(_URB_BUFFER, length) if length > 0 else None
        payload = bytes(buffer.retrieve()) if buffer is not None else b""
        control = kind == _URB_TYPE_CONTROL
        if control:
            if length < _SETUP.size:
                raise OSError(errno.EINVAL, "a control URB without a setup packet")
            request_type, request, value, index, size = _SETUP.unpack_from(payload)
            sim = SimUrb(0, request_type, request, value, index, length=size)
            if not sim.is_in:
                sim.data = payload[_SETUP.size : _SETUP.size + size]
        elif endpoint & 0x80:
            sim = SimUrb(endpoint, length=length)
        else:
            sim = SimUrb(endpoint, data=payload)
        address = int(urb_data.client_addr)
        connection.in_flight[address] = _Urb(urb_data, buffer, length, sim, control)
        sim.on_complete = lambda done: self._finished(connection, address, done)
        if control and sim.request_type == _STANDARD_IN and sim.request == _GET_DESCRIPTOR:
            self._get_descriptor(sim)  # standard requests never reach the bridge
        else:
            try:
                self.server.call(self.bridge.submit, sim)
            except RuntimeError as exc:  # the simulation has stopped
                del connection.in_flight[address]
                raise OSError(errno.ENODEV, str(exc)) from exc
        return 0

    @staticmethod
    def _finished(connection: _Connection, address: int, urb: SimUrb) -> None:
        """On the simulation's thread: the URB can be reaped."""
        if urb.status is UrbStatus.NO_DEVICE:
            connection.gone = True
        connection.finished.append(address)

    def _get_descriptor(self, urb: SimUrb) -> None:
        kind, index = urb.value >> 8, urb.value & 0xFF
        if kind == 1:
            found: bytes | None = self.descriptors[:18]
        elif kind == 2 and index == 0:
            found = self.descriptors[18:]
        elif kind == 3:
            found = self.strings.get(index)
        else:
            found = None
        if found is None:
            urb.complete(UrbStatus.STALL, error=f"no descriptor 0x{urb.value:04x}")
            return
        answer = found[: urb.length]
        urb.complete(UrbStatus.COMPLETED, actual=len(answer), result=answer)

    def _reap(self, client: Any, connection: _Connection) -> int:
        try:
            address = connection.finished.popleft()
        except IndexError:
            if connection.gone:
                raise OSError(errno.ENODEV, "the device left the bus") from None
            raise OSError(errno.EAGAIN, "no URB has finished") from None
        urb = connection.in_flight.pop(address)
        sim = urb.sim
        actual = sim.actual
        if sim.is_in and sim.result and urb.buffer is not None:
            offset = _SETUP.size if urb.control else 0
            data = sim.result[: max(0, urb.length - offset)]
            urb.buffer.update(offset, data)
            actual = len(data)
        urb.struct_data.update(_URB_STATUS, struct.pack("<i", urb_status(sim.status)))
        urb.struct_data.update(_URB_ACTUAL, struct.pack("<i", actual))
        client.get_arg().resolve(0, 8).set_ptr(0, urb.struct_data)
        return 0

    def _discard(self, client: Any, connection: _Connection) -> int:
        (address,) = struct.unpack_from("<Q", bytes(client.get_arg().retrieve()))
        urb = connection.in_flight.get(address)
        if urb is None or urb.sim.done:
            raise OSError(errno.EINVAL, "no such URB in flight")  # finished: reap it
        self.discards += 1
        self.server.call(self.bridge.discard, urb.sim)
        return 0

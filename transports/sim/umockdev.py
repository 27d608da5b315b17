"""The simulated bridge as a USB device that real libusb opens: an emulated usbfs node (umockdev).

:class:`EmulatedBridge` puts a device ``add1:0001`` (product "custom ...") into a umockdev
testbed — its sysfs attributes, its descriptors (interface 0 with bulk OUT 0x02 and bulk IN 0x81),
a ``/dev/bus/usb/BBB/DDD`` node — and answers the usbdevfs ioctls that libusb issues on that node.
Transfers become :class:`~transports.sim.urb.SimUrb` s for a :class:`~transports.sim.bridge.SimBridge`
running in a :class:`~transports.sim.server.SimServer`, so the whole host stack above the kernel —
libusb, python-libusb1 or pyusb, the transports — runs for real against the simulation::

    with SimServer(make_bridge) as server, EmulatedBridge(server, server.device) as device:
        async with LibusbContext() as usb:
            transport = await open_bridge(usb, timeout=5)

This needs the process to run under ``umockdev-wrapper`` (libumockdev-preload redirects ``/sys``
and ``/dev`` into the testbed) and PyGObject with umockdev's typelib: :func:`umockdev_available`
says whether it does, and :class:`EmulatedBridge` (and :func:`require_umockdev`) raise
:class:`UmockdevUnavailable` saying why not.

The ioctl handler runs on umockdev's own thread. What it does, per usbdevfs ioctl:

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
itself stays in the testbed: the emulation is not told when the bridge is back on the bus.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from .bridge import SimBridge
from .urb import SimUrb, UrbStatus

__all__ = [
    "EmulatedBridge",
    "UmockdevUnavailable",
    "descriptors",
    "require_umockdev",
    "umockdev_available",
    "urb_status",
]


class UmockdevUnavailable(RuntimeError):
    """No emulated USB here: not under ``umockdev-wrapper``, or PyGObject/umockdev missing."""


class _Server(Protocol):
    def call(self, fn: Any, *args: Any) -> None: ...


def _preload_active() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libumockdev-preload" in maps.read()
    except OSError:
        return "libumockdev-preload" in os.environ.get("LD_PRELOAD", "")


def require_umockdev() -> Any:
    """The ``gi.repository.UMockdev`` module, or :class:`UmockdevUnavailable` saying why not."""
    if not _preload_active():
        raise UmockdevUnavailable(
            "emulated USB needs libumockdev-preload: run the process under umockdev-wrapper"
        )
    try:
        import gi  # type: ignore[import-untyped]

        gi.require_version("UMockdev", "1.0")
        from gi.repository import UMockdev  # type: ignore[import-untyped]
    except (ImportError, ValueError) as exc:
        raise UmockdevUnavailable(
            f"emulated USB needs PyGObject and umockdev's typelib (gir1.2-umockdev-1.0): {exc}"
        ) from exc
    return UMockdev


def umockdev_available() -> bool:
    """Whether :class:`EmulatedBridge` can run in this process."""
    try:
        require_umockdev()
    except UmockdevUnavailable:
        return False
    return True


# usbdevfs ioctl numbers (type 'U'); matched on the number alone, so size and direction bits of
# either ABI variant match.
_SETINTERFACE, _SETCONFIGURATION, _GETDRIVER = 4, 5, 8
_SUBMITURB, _DISCARDURB, _REAPURB, _REAPURBNDELAY = 10, 11, 12, 13
_CLAIMINTERFACE, _RELEASEINTERFACE, _IOCTL, _RESET, _CLEAR_HALT = 15, 16, 18, 20, 21
_GET_CAPABILITIES, _DISCONNECT_CLAIM, _GET_SPEED = 26, 27, 31
_CAP_NO_PACKET_SIZE_LIM, _CAP_REAP_AFTER_DISCONNECT = 0x04, 0x10

_URB_SIZE = 56  # struct usbdevfs_urb on x86_64 (no iso packets)
_URB_HEAD = struct.Struct("<BBxxiI4xQii")  # type, endpoint, status, flags, buffer, length, actual
_URB_TYPE_CONTROL = 2
_SETUP = struct.Struct("<BBHHH")

_STATUS = {
    UrbStatus.COMPLETED: 0,
    UrbStatus.STALL: -errno.EPIPE,
    UrbStatus.NO_DEVICE: -errno.ENODEV,
    UrbStatus.CANCELLED: -errno.ENOENT,
}


def urb_status(status: UrbStatus | None) -> int:
    """The usbfs status a finished URB is reaped with."""
    return -errno.EPROTO if status is None else _STATUS[status]


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


def descriptors(*, superspeed: bool, vendor: int, product: int) -> bytes:
    """Device and configuration descriptors: interface 0 (vendor class), bulk OUT 0x02 and bulk
    IN 0x81 with max packet 1024 (SuperSpeed, with endpoint companions) or 512 (high speed)."""
    packet = 1024 if superspeed else 512
    device = struct.pack(
        "<BBHBBBBHHHBBBB",
        18, 1, 0x0320 if superspeed else 0x0200, 0, 0, 0, 9 if superspeed else 64,
        vendor, product, 0x0100, 1, 2, 0, 1,
    )  # fmt: skip

    def endpoint(address: int) -> bytes:
        desc = struct.pack("<BBBBHB", 7, 5, address, 2, packet, 0)
        return desc + (struct.pack("<BBBBH", 6, 0x30, 15, 0, 0) if superspeed else b"")

    interface = struct.pack("<BBBBBBBBB", 9, 4, 0, 0, 2, 0xFF, 0, 0, 0)
    body = interface + endpoint(0x02) + endpoint(0x81)
    config = struct.pack("<BBHBBBBB", 9, 2, 9 + len(body), 1, 1, 0, 0x80, 50)
    return device + config + body


def _string_descriptor(text: str) -> bytes:
    encoded = text.encode("utf-16-le")
    return bytes([2 + len(encoded), 3]) + encoded


class EmulatedBridge:
    """Serves ``bridge`` (running in ``server``) as an emulated USB device, while entered.

    ``server.call(fn, *args)`` must run ``fn`` on the simulation's thread (a
    :class:`~transports.sim.server.SimServer`). ``speed`` is ``"super"`` (5 Gb/s, 1024-byte bulk
    packets) or ``"high"`` (480 Mb/s, 512). One emulated device per process at a time: umockdev's
    preload serves one testbed.
    """

    def __init__(
        self,
        server: _Server,
        bridge: SimBridge,
        *,
        vendor: int = 0xADD1,
        product: int = 0x0001,
        product_name: str = "custom USB-PCIe bridge (emulated)",
        manufacturer: str = "aio-dms simulator",
        speed: str = "super",
        busnum: int = 2,
        devnum: int = 2,
    ) -> None:
        if speed not in ("super", "high"):
            raise ValueError(f"speed must be 'super' or 'high', got {speed!r}")
        self.server = server
        self.bridge = bridge
        self.vendor, self.product = vendor, product
        self.product_name, self.manufacturer = product_name, manufacturer
        self.speed = speed
        self.busnum, self.devnum = busnum, devnum
        self.devnode = f"/dev/bus/usb/{busnum:03d}/{devnum:03d}"
        self.descriptors = descriptors(superspeed=speed == "super", vendor=vendor, product=product)
        self.testbed: Any = None
        self.syspath: str | None = None
        self.ioctls = 0
        """How many ioctls the device has answered (reap polls included)."""
        self.discards = 0
        """How many URBs in flight the host has discarded."""
        self._handler: Any = None
        self._connections: dict[int, _Connection] = {}
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> EmulatedBridge:
        umockdev = require_umockdev()
        self.testbed = umockdev.Testbed.new()
        if not self.testbed.add_from_string(self._record()):
            raise UmockdevUnavailable("umockdev refused the emulated device's description")
        self.syspath = f"/sys{self._sysfs_path}"
        self._handler = umockdev.IoctlBase()
        self._handler.connect("handle-ioctl", self._on_ioctl)
        if not self.testbed.attach_ioctl(self.devnode, self._handler):
            raise UmockdevUnavailable(
                f"umockdev could not attach an ioctl handler to {self.devnode}"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.testbed is not None:
            self.testbed.detach_ioctl(self.devnode)
            if self.syspath:
                self.testbed.remove_device(self.syspath)
        self.testbed = self._handler = self.syspath = None
        with self._lock:
            self._connections.clear()

    @property
    def _sysfs_path(self) -> str:
        return f"/devices/pci0000:00/0000:00:14.0/usb{self.busnum}/{self.busnum}-1"

    def _record(self) -> str:
        """The device in umockdev's record format; ``A:`` values end in a newline, as in sysfs."""
        lines = [
            f"P: {self._sysfs_path}",
            f"N: bus/usb/{self.busnum:03d}/{self.devnum:03d}",
            f"E: DEVNAME={self.devnode}",
            "E: DEVTYPE=usb_device",
            "E: DRIVER=usb",
            "E: SUBSYSTEM=usb",
            f"E: PRODUCT={self.vendor:x}/{self.product:x}/100",
            f"E: BUSNUM={self.busnum:03d}",
            f"E: DEVNUM={self.devnum:03d}",
        ]
        attributes = {
            "busnum": str(self.busnum),
            "devnum": str(self.devnum),
            "idVendor": f"{self.vendor:04x}",
            "idProduct": f"{self.product:04x}",
            "speed": "5000" if self.speed == "super" else "480",
            "product": self.product_name,
            "manufacturer": self.manufacturer,
            "bConfigurationValue": "1",
            "bNumInterfaces": " 1",
        }
        lines += [f"A: {name}={value}\\n" for name, value in attributes.items()]
        lines.append(f"H: descriptors={self.descriptors.hex().upper()}")
        return "\n".join(lines) + "\n"

    # -- the ioctl handler (umockdev's thread) -------------------------------------------------

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

    def _on_ioctl(self, _handler: Any, client: Any) -> bool:
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
        if number in (_REAPURB, _REAPURBNDELAY):  # REAPURB (blocking) is never issued by libusb
            return self._reap(client, connection)
        if connection.gone:
            raise OSError(errno.ENODEV, "the device left the bus")
        if number == _SUBMITURB:
            return self._submit(client, connection)
        if number == _DISCARDURB:
            return self._discard(client, connection)
        if number == _GET_CAPABILITIES:
            self._write_u32(client, _CAP_NO_PACKET_SIZE_LIM | _CAP_REAP_AFTER_DISCONNECT)
            return 0
        if number in (_CLAIMINTERFACE, _RELEASEINTERFACE, _DISCONNECT_CLAIM):
            return self._expect(client, 0, "interface")
        if number == _SETCONFIGURATION:
            return self._expect(client, 1, "configuration")
        if number == _SETINTERFACE:
            if self._read(client, 8) != bytes(8):
                raise OSError(errno.EINVAL, "only interface 0, alternate setting 0")
            return 0
        if number in (_GETDRIVER, _IOCTL):
            raise OSError(errno.ENODATA, "no kernel driver is bound")
        if number == _RESET:
            self.server.call(self.bridge.reset)
            return 0
        if number == _CLEAR_HALT:
            return 0
        if number == _GET_SPEED:
            return 5 if self.speed == "super" else 3  # USB_SPEED_SUPER / USB_SPEED_HIGH
        raise OSError(errno.ENOTTY, f"usbdevfs ioctl {number} is not emulated")

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
        buffer = urb_data.resolve(16, length) if length > 0 else None
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
        if control and sim.request_type == 0x80 and sim.request == 6:
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
        strings = {0: b"\x04\x03\x09\x04", 1: _string_descriptor(self.manufacturer)}
        strings[2] = _string_descriptor(self.product_name)
        if kind == 1:
            found: bytes | None = self.descriptors[:18]
        elif kind == 2 and index == 0:
            found = self.descriptors[18:]
        elif kind == 3:
            found = strings.get(index)
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
        urb.struct_data.update(4, struct.pack("<i", urb_status(sim.status)))
        urb.struct_data.update(28, struct.pack("<i", actual))
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

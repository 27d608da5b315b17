"""The simulated bridge as a USB device that real libusb opens: an emulated usbfs node (umockdev).

:class:`EmulatedBridge` puts a device ``add1:0001`` (product "custom ...") into a umockdev
testbed — its sysfs attributes, its descriptors (interface 0 with bulk OUT 0x02 and bulk IN 0x81),
a ``/dev/bus/usb/BBB/DDD`` node — whose usbdevfs ioctls, those that libusb issues, it answers.
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

The ioctls on the node are answered by a :class:`~transports.sim.usbfs.UsbfsDevice` (see there
what each does), on umockdev's own thread.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from ..protocol.bridge import BRIDGE_IDS, EP_BULK_IN, EP_BULK_OUT
from .bridge import SimBridge
from .usbfs import Server, UsbfsDevice

__all__ = [
    "EmulatedBridge",
    "UmockdevUnavailable",
    "descriptors",
    "require_umockdev",
    "umockdev_available",
]


class UmockdevUnavailable(RuntimeError):
    """No emulated USB here: not under ``umockdev-wrapper``, or PyGObject/umockdev missing."""


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
    body = interface + endpoint(EP_BULK_OUT) + endpoint(EP_BULK_IN)
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
        server: Server,
        bridge: SimBridge,
        *,
        vendor: int = BRIDGE_IDS[0][0],
        product: int = BRIDGE_IDS[0][1],
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
        self.device = UsbfsDevice(
            server,
            bridge,
            descriptors=self.descriptors,
            strings={
                0: b"\x04\x03\x09\x04",  # the languages: US English
                1: _string_descriptor(manufacturer),
                2: _string_descriptor(product_name),
            },
            superspeed=speed == "super",
        )
        self.testbed: Any = None
        self.syspath: str | None = None
        self._handler: Any = None

    @property
    def ioctls(self) -> int:
        """How many ioctls the device has answered (reap polls included)."""
        return self.device.ioctls

    @property
    def discards(self) -> int:
        """How many URBs in flight the host has discarded."""
        return self.device.discards

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

    def __exit__(self, *exc_info: object) -> None:
        if self.testbed is not None:
            self.testbed.detach_ioctl(self.devnode)
            if self.syspath:
                self.testbed.remove_device(self.syspath)
        self.testbed = self._handler = self.syspath = None
        self.device.close()

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

    def _on_ioctl(self, _handler: Any, client: Any) -> bool:
        return self.device.handle(client)

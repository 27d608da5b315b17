"""The simulated USB-PCIe bridge: what a host reaches through USB vendor requests and bulk endpoints.

Modelled on spec hardware-waits §4.2-4.4 and §4.8; where the spec only names a thing, the layout is
ours and is documented here.

Controller memory ("XDATA", 64 KiB), read with 0xE4 and written a byte at a time with 0xE5:

=============  ==========================================================================
0xA000-0xAFFF  the 4 KiB *sys page*, also visible to the GPU at PCIe 0x820000; the copy
               protocol's chunk fence is the dword at +0x800 (XDATA 0xA800, PCIe 0x820800)
0xB450         the LTSSM (link state) byte: 0x78 once the PCIe link is up
=============  ==========================================================================

Bridge memory reached only from the PCIe side (the GPU's DMA):

- the *cq page*, 0x200 bytes at PCIe 0x822000: a write of 0 to its dword at +12 (PCIe 0x82200C)
  releases an armed SRAM read;
- the 512 KiB SRAM at PCIe 0x200000, 32 slots of 16 KiB (halves at slot 0 and slot 16). The host
  reaches it only through the DMA engine: arm with 0xF2, then move the data on the bulk endpoints.

Vendor requests (bmRequestType 0x40 out, 0xC0 in):

- ``0xE4`` in: ``wValue`` = XDATA address, up to 0xFF bytes.
- ``0xE5`` out: ``wValue`` = XDATA address, ``wIndex`` = the byte.
- ``0xF3`` out: PCIe power, ``wValue`` 1 = on, 0 = off. The link trains ``link_latency`` seconds
  after power-on (the LTSSM byte reads 0x78 from then on).
- ``0xF0`` out: a PCIe request. ``wValue`` = TLP fmt/type | byte-enables << 8 (the enabled byte
  lanes of the dword at the dword-aligned address; data sits in its lanes); ``wIndex`` = mode:
  0 one TLP, 1 streaming memory write (the data follows on bulk OUT), 2 streaming memory read (the
  data comes back on bulk IN). Data: 12 bytes = address low, address high, and the value (mode 0)
  or the dword count (modes 1, 2), little-endian u32 each.
- ``0xF0`` in: 8 bytes, the completion of the last non-posted TLP: u32 data, the completion status
  in bits 5-7 of byte 4 (0 success, 1 unsupported request, 2 configuration retry, 4 completer
  abort), and the bridge's own return status in byte 7 (non-zero: "busy, retry the request").
- ``0xF2`` out: arm the SRAM DMA engine for the next bulk transfer. ``wValue`` = number of 512-byte
  sectors, bit 15 set for a read (SRAM to host); ``wIndex`` = start slot | slot count << 8. An
  armed write takes the next bulk OUT into SRAM; an armed read answers the next bulk IN only once
  the GPU has released it through the cq page.

Configuration TLPs carry bus/device/function in the address as ``bus << 24 | device << 19 |
function << 16 | register``; type 0x04/0x44 (read/write, type 0), 0x05/0x45 (type 1).
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import anyio

from aio_runtime import now

from .faults import Fault, FaultPlan

__all__ = [
    "CQ_PCIE",
    "CQ_RELEASE_PCIE",
    "FENCE_XDATA",
    "LINK_UP",
    "LTSSM_XDATA",
    "SLOT",
    "SRAM_PCIE",
    "SRAM_SIZE",
    "SYS_PCIE",
    "SYS_XDATA",
    "CompletionStatus",
    "PcieTarget",
    "SimBridge",
    "SimDeviceGone",
    "SimTransferError",
]

XDATA_SIZE = 0x10000
SYS_XDATA, SYS_PCIE, SYS_SIZE = 0xA000, 0x820000, 0x1000
FENCE_XDATA = SYS_XDATA + 0x800
LTSSM_XDATA, LINK_UP = 0xB450, 0x78
CQ_PCIE, CQ_SIZE = 0x822000, 0x200
CQ_RELEASE_PCIE = CQ_PCIE + 12
SRAM_PCIE, SRAM_SIZE, SLOT, SECTOR = 0x200000, 0x80000, 0x4000, 512

VENDOR_OUT, VENDOR_IN = 0x40, 0xC0
EP_BULK_OUT, EP_BULK_IN = 0x02, 0x81


class CompletionStatus(enum.IntEnum):
    SUCCESS = 0
    UNSUPPORTED_REQUEST = 1
    CONFIG_RETRY = 2
    COMPLETER_ABORT = 4


class PcieTarget(Protocol):
    """What sits behind the bridge (the simulated GPU). Raise ``LookupError`` for an address
    nothing claims (the bridge answers "unsupported request")."""

    def config_read(self, bus: int, device: int, function: int, register: int) -> int: ...

    def config_write(
        self, bus: int, device: int, function: int, register: int, value: int, byte_enables: int
    ) -> None: ...

    def memory_read(self, address: int, size: int) -> bytes: ...

    def memory_write(self, address: int, data: bytes) -> None: ...


class SimTransferError(Exception):
    """The simulated device rejected a transfer (a stall): malformed or unexpected request."""


class SimDeviceGone(Exception):
    """The simulated device is not there (unplugged, powered off): no device."""


@dataclass
class _Armed:
    read: bool
    offset: int
    length: int


@dataclass
class _Stream:
    write: bool
    address: int
    length: int


# TLP fmt/type values (the low byte of wValue for 0xF0).
_MRD32, _MRD64, _MWR32, _MWR64 = 0x00, 0x20, 0x40, 0x60
_CFG_READ = {0x04, 0x05}
_CFG_WRITE = {0x44, 0x45}


class SimBridge:
    """The bridge's USB face. A backend (in-process, or umockdev) turns each USB transfer into one
    call here: :meth:`control_in`, :meth:`control_out`, :meth:`bulk_out`, :meth:`bulk_in`.

    The GPU side calls :meth:`dma_write` / :meth:`dma_read` for its accesses to bridge memory.
    Faults from ``plan`` apply per transfer: ``DISCONNECT`` (the bridge leaves the bus — see
    :meth:`unplug` — and every transfer fails with no device while the rule is active; when it
    returns it has re-enumerated: powered off, nothing armed), ``USB_TIMEOUT`` (the device never
    answers), ``SHORT_TRANSFER`` (a data stage cut short), ``TLP_RETRY_STORM`` (non-posted PCIe
    requests are answered "retry"). A bulk transfer that does not complete (a fault, or the host
    cancelling it) disarms the DMA engine, so the host can arm again.
    """

    def __init__(
        self,
        target: PcieTarget,
        *,
        plan: FaultPlan | None = None,
        link_latency: float = 0.0,
    ) -> None:
        self.target = target
        self.plan = plan if plan is not None else FaultPlan()
        self.link_latency = link_latency
        self.xdata = bytearray(XDATA_SIZE)
        self.sram = bytearray(SRAM_SIZE)
        self.cq = bytearray(CQ_SIZE)
        self._link_up_at: float | None = None
        self._completion = bytes(8)
        self._armed: _Armed | None = None
        self._stream: _Stream | None = None
        self._released = anyio.Event()
        self._gone = False
        self.requests: deque[tuple[str, int, int, int]] = deque(maxlen=1024)
        """The latest transfers, as (kind, request or endpoint, value, index): for protocol tests.
        Bounded, so a long simulation does not grow without limit."""

    # -- link state ----------------------------------------------------------------------------

    def _ltssm(self) -> int:
        if self._link_up_at is not None and now() >= self._link_up_at:
            return LINK_UP
        return 0

    def _xdata_read(self, address: int, length: int) -> bytes:
        self.xdata[LTSSM_XDATA] = self._ltssm()
        return bytes(self.xdata[address : address + length])

    # -- transfers -----------------------------------------------------------------------------

    async def _transfer_faults(self, carries_data: bool) -> int | None:
        """Apply the per-transfer faults; return a short length to use, if one fires.

        ``SHORT_TRANSFER`` applies only to transfers that carry data (a request with no data
        stage has nothing to cut short).
        """
        if self._gone:
            self._reappear()
        if self.plan.check(Fault.DISCONNECT):
            self.unplug()
            raise SimDeviceGone("the bridge is not on the bus")
        if self.plan.check(Fault.USB_TIMEOUT):
            await anyio.Event().wait()  # the device never answers; the host's timeout ends this
        rule = self.plan.check(Fault.SHORT_TRANSFER) if carries_data else None
        if rule is None:
            return None
        length = rule.params.get("length", -1)
        return int(length) if isinstance(length, int) else -1

    async def control_in(self, request: int, value: int, index: int, length: int) -> bytes:
        self.requests.append(("control_in", request, value, index))
        short = await self._transfer_faults(carries_data=True)
        if request == 0xE4:
            if not (0 < length <= 0xFF and value + length <= XDATA_SIZE):
                raise SimTransferError(f"0xE4 read of {length} bytes at 0x{value:x}")
            data = self._xdata_read(value, length)
        elif request == 0xF0:
            if length != 8:
                raise SimTransferError(f"0xF0 completion read of {length} bytes, expected 8")
            data = self._completion
        else:
            raise SimTransferError(f"unknown vendor IN request 0x{request:x}")
        return data[: _short(short, len(data))]

    async def control_out(self, request: int, value: int, index: int, data: bytes) -> int:
        """Returns how many bytes of the data stage the device took."""
        self.requests.append(("control_out", request, value, index))
        short = await self._transfer_faults(carries_data=bool(data))
        if short is not None:
            return _short(short, len(data))  # a cut data stage: the request is not carried out
        if request == 0xE5:
            if data or not (0 <= value < XDATA_SIZE and 0 <= index <= 0xFF):
                raise SimTransferError(f"0xE5 write of 0x{index:x} at 0x{value:x}")
            if value != LTSSM_XDATA:
                self.xdata[value] = index
        elif request == 0xF3:
            if value != 1:
                self._link_up_at = None
            elif self._link_up_at is None:  # powering on again does not retrain a link
                self._link_up_at = now() + self.link_latency
        elif request == 0xF0:
            await self._pcie_request(value, index, data)
        elif request == 0xF2:
            self._arm(value, index)
        else:
            raise SimTransferError(f"unknown vendor OUT request 0x{request:x}")
        return len(data)

    async def bulk_out(self, endpoint: int, data: bytes) -> int:
        self.requests.append(("bulk_out", endpoint, len(data), 0))
        if endpoint != EP_BULK_OUT:
            raise SimTransferError(f"bulk OUT on endpoint 0x{endpoint:x}")
        armed, stream = self._armed, self._stream
        try:
            short = await self._transfer_faults(carries_data=True)
        except BaseException:
            self._abort(armed, stream)  # a transfer that did not complete disarms the engine
            raise
        accepted = _short(short, len(data))
        if armed is not None and not armed.read:
            self._armed = None
            if len(data) != armed.length:
                raise SimTransferError(
                    f"bulk OUT of {len(data)} bytes for an SRAM write armed for {armed.length}"
                )
            self.sram[armed.offset : armed.offset + accepted] = data[:accepted]
        elif stream is not None and stream.write:
            self._stream = None
            if len(data) != stream.length:
                raise SimTransferError(
                    f"bulk OUT of {len(data)} bytes for a stream write of {stream.length}"
                )
            self._route_write(stream.address, bytes(data[:accepted]))
        else:
            raise SimTransferError("bulk OUT with no armed SRAM write or stream write")
        return accepted

    async def bulk_in(self, endpoint: int, length: int) -> bytes:
        self.requests.append(("bulk_in", endpoint, length, 0))
        if endpoint != EP_BULK_IN:
            raise SimTransferError(f"bulk IN on endpoint 0x{endpoint:x}")
        armed, stream = self._armed, self._stream
        try:
            short = await self._transfer_faults(carries_data=True)
            if armed is not None and armed.read:
                if length != armed.length:
                    raise SimTransferError(
                        f"bulk IN of {length} bytes for an SRAM read armed for {armed.length}"
                    )
                await self._released.wait()  # the GPU's write to the cq page releases it
                if self._gone:
                    raise SimDeviceGone("the bridge went away during the transfer")
                self._armed = None
                data = bytes(self.sram[armed.offset : armed.offset + armed.length])
            elif stream is not None and not stream.write:
                self._stream = None
                if length != stream.length:
                    raise SimTransferError(
                        f"bulk IN of {length} bytes for a stream read of {stream.length}"
                    )
                data = self._route_read(stream.address, stream.length)
            else:
                raise SimTransferError("bulk IN with no armed SRAM read or stream read")
        except BaseException:
            self._abort(armed, stream)
            raise
        return data[: _short(short, len(data))]

    def _abort(self, armed: _Armed | None, stream: _Stream | None) -> None:
        """A bulk transfer ended without completing: the DMA engine drops what it was armed for."""
        if armed is not None and self._armed is armed:
            self._armed = None
        if stream is not None and self._stream is stream:
            self._stream = None

    def reset(self) -> None:
        """A USB reset: forget armed transfers and pending streams (memory is kept)."""
        self._armed = None
        self._stream = None
        self._released.set()  # wake a transfer still waiting; it finds nothing armed
        self._released = anyio.Event()

    def unplug(self) -> None:
        """The bridge leaves the bus: transfers in flight fail; on its return it is powered off
        and has forgotten every armed transfer (it re-enumerates from scratch)."""
        self._gone = True
        self._link_up_at = None
        self._armed = None
        self._stream = None
        self._released.set()

    def _reappear(self) -> None:
        self._gone = False
        self._released = anyio.Event()

    # -- the DMA engine ------------------------------------------------------------------------

    def _arm(self, value: int, index: int) -> None:
        sectors, read = value & 0x7FFF, bool(value & 0x8000)
        start, count = index & 0xFF, index >> 8
        offset, length = start * SLOT, sectors * SECTOR
        if not sectors or offset + length > SRAM_SIZE or length > count * SLOT:
            raise SimTransferError(
                f"0xF2 arm of {sectors} sectors at slot {start} ({count} slots) does not fit"
            )
        if self._armed is not None:
            raise SimTransferError("0xF2 arm while a transfer is already armed")
        self._armed = _Armed(read, offset, length)
        self._released = anyio.Event()

    # -- PCIe ----------------------------------------------------------------------------------

    async def _pcie_request(self, value: int, mode: int, data: bytes) -> None:
        if len(data) != 12:
            raise SimTransferError(f"0xF0 request carries {len(data)} bytes, expected 12")
        low, high, word = struct.unpack("<III", data)
        address, fmt_type, byte_enables = high << 32 | low, value & 0xFF, (value >> 8) & 0xFF
        if mode in (1, 2):
            if fmt_type not in (_MWR32, _MWR64, _MRD32, _MRD64):
                raise SimTransferError(f"0xF0 streaming mode {mode} with TLP 0x{fmt_type:x}")
            if word == 0:
                await anyio.Event().wait()  # a zero-length stream hangs the bridge (spec U15)
            if self._ltssm() != LINK_UP:
                raise SimTransferError("0xF0 stream with the PCIe link down")
            self._stream = _Stream(mode == 1, address, word * 4)
            return
        if mode != 0:
            raise SimTransferError(f"0xF0 mode {mode}")
        posted = fmt_type in (_MWR32, _MWR64)
        if not posted and self.plan.check(Fault.TLP_RETRY_STORM):
            self._complete(0, CompletionStatus.SUCCESS, bridge_status=1)
            return
        if self._ltssm() != LINK_UP:  # a posted write to a link that is down is simply lost
            self._complete(0, CompletionStatus.UNSUPPORTED_REQUEST)
            return
        lanes = byte_enables & 0xF or 0xF  # which bytes of the dword the TLP carries
        first, size = (lanes & -lanes).bit_length() - 1, bin(lanes).count("1")
        try:
            if posted:  # no completion; an unclaimed address drops it
                self._route_write(address + first, word.to_bytes(4, "little")[first : first + size])
            elif fmt_type in (_MRD32, _MRD64):
                read = self.target.memory_read(address + first, size)
                self._complete(int.from_bytes(read, "little") << (8 * first))
            elif fmt_type in _CFG_READ or fmt_type in _CFG_WRITE:
                bus, device, function = low >> 24, (low >> 19) & 0x1F, (low >> 16) & 0x7
                if (fmt_type & 1) != (bus > 0):  # type 0 reaches bus 0 only, type 1 the rest
                    raise LookupError(f"config type {fmt_type & 1} for bus {bus}")
                register = low & 0xFFC
                if fmt_type in _CFG_READ:
                    self._complete(self.target.config_read(bus, device, function, register))
                else:
                    self.target.config_write(bus, device, function, register, word, byte_enables)
                    self._complete(0)
            else:
                raise SimTransferError(f"TLP fmt/type 0x{fmt_type:x} is not supported")
        except LookupError:
            self._complete(0, CompletionStatus.UNSUPPORTED_REQUEST)

    def _complete(
        self, data: int, status: CompletionStatus = CompletionStatus.SUCCESS, bridge_status: int = 0
    ) -> None:
        self._completion = struct.pack(
            "<IBBBB", data & 0xFFFFFFFF, status << 5, 0, 0, bridge_status
        )

    def _route_write(self, address: int, data: bytes) -> None:
        """A host memory write goes to the GPU; one nobody claims is dropped (writes are posted)."""
        try:
            self.target.memory_write(address, data)
        except LookupError:
            pass

    def _route_read(self, address: int, size: int) -> bytes:
        """A host memory read; nobody claiming it reads all ones (a master abort)."""
        try:
            return self.target.memory_read(address, size)
        except LookupError:
            return b"\xff" * size

    # -- the GPU's side ------------------------------------------------------------------------

    def dma_write(self, address: int, data: bytes) -> None:
        """A GPU write into bridge memory (sys page, cq page, SRAM)."""
        for base, memory in ((SYS_PCIE, None), (CQ_PCIE, self.cq), (SRAM_PCIE, self.sram)):
            size = SYS_SIZE if memory is None else len(memory)
            if base <= address and address + len(data) <= base + size:
                offset = address - base
                if memory is None:
                    self.xdata[SYS_XDATA + offset : SYS_XDATA + offset + len(data)] = data
                else:
                    memory[offset : offset + len(data)] = data
                armed_read = self._armed is not None and self._armed.read
                if base == CQ_PCIE and armed_read and offset <= 12 < offset + len(data):
                    if self.cq[12:16] == bytes(4):
                        self._released.set()  # only an armed read can be released
                return
        raise LookupError(f"no bridge memory at PCIe 0x{address:x}+{len(data)}")

    def dma_read(self, address: int, size: int) -> bytes:
        """A GPU read of bridge memory (a copy engine polling a sentinel in SRAM)."""
        for base, memory in ((SYS_PCIE, None), (CQ_PCIE, self.cq), (SRAM_PCIE, self.sram)):
            limit = SYS_SIZE if memory is None else len(memory)
            if base <= address and address + size <= base + limit:
                offset = address - base
                if memory is None:
                    return bytes(self.xdata[SYS_XDATA + offset : SYS_XDATA + offset + size])
                return bytes(memory[offset : offset + size])
        raise LookupError(f"no bridge memory at PCIe 0x{address:x}+{size}")


def _short(short: int | None, length: int) -> int:
    """The length a transfer delivers: all of it, or what a SHORT_TRANSFER fault allows."""
    if short is None:
        return length
    return length // 2 if short < 0 else min(short, max(0, length - 1))

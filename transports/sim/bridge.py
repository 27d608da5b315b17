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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aio_runtime import loop_clock

from ..hwdefs import (
    CQ_PCIE,
    CQ_RELEASE_PCIE,
    CQ_SIZE,
    EP_BULK_IN,
    EP_BULK_OUT,
    FENCE_XDATA,
    LINK_UP,
    LTSSM_XDATA,
    SECTOR,
    SLOT,
    SRAM_PCIE,
    SRAM_SIZE,
    SYS_PCIE,
    SYS_SIZE,
    SYS_XDATA,
    XDATA_SIZE,
)
from .faults import Fault, FaultPlan
from .urb import SimUrb, UrbStatus

__all__ = [
    "CQ_PCIE",
    "CQ_RELEASE_PCIE",
    "EP_BULK_IN",
    "EP_BULK_OUT",
    "FENCE_XDATA",
    "LINK_UP",
    "LTSSM_XDATA",
    "MAX_ARMS",
    "SLOT",
    "SRAM_PCIE",
    "SRAM_SIZE",
    "SYS_PCIE",
    "CompletionStatus",
    "PcieTarget",
    "SimBridge",
]

MAX_ARMS = 4
"""How many 0xF2 arms the DMA engine queues ahead of their bulk transfers."""

VENDOR_OUT, VENDOR_IN = 0x40, 0xC0


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


class _Refused(Exception):
    """A request the bridge refuses: the URB ends with a stall."""


@dataclass(eq=False)
class _Arm:
    read: bool
    offset: int
    length: int
    released: bool = False


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
    """The bridge's USB face: :meth:`submit` a :class:`SimUrb`, :meth:`discard` one in flight.

    Control requests complete when submitted. Bulk transfers are served in order per endpoint (a
    transfer that cannot finish holds back those behind it, as on a real endpoint). A bulk OUT takes
    the pending streaming write, else the oldest 0xF2 arm (which must be a write); its data lands in
    SRAM and the GPU is told (:attr:`on_sram_write`). A bulk IN takes the pending streaming read,
    else the oldest arm (a read), and completes only once the GPU has released that arm by writing 0
    to the cq page's dword +12 — a release may come before the bulk IN is submitted, and a release
    with no read armed releases nothing. Up to :data:`MAX_ARMS` arms queue ahead of their transfers.
    A discarded bulk transfer at the head of its endpoint drops the arm it would have used.

    The GPU side calls :meth:`dma_write` / :meth:`dma_read` for its accesses to bridge memory.
    Faults from ``plan`` apply per transfer: ``DISCONNECT`` (the bridge leaves the bus — see
    :meth:`unplug` — and every transfer fails with no device while the rule is active; when it
    returns it has re-enumerated: powered off, nothing armed), ``USB_TIMEOUT`` (the device never
    answers the transfer), ``SHORT_TRANSFER`` (a data stage cut short), ``TLP_RETRY_STORM``
    (non-posted PCIe requests are answered "retry"), ``USB_COMPLETION_LOST`` (a bulk OUT's data
    lands and the GPU sees it, but the transfer never completes).
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
        self._clock = loop_clock()
        self.xdata = bytearray(XDATA_SIZE)
        self.sram = bytearray(SRAM_SIZE)
        self.cq = bytearray(CQ_SIZE)
        self.on_sram_write: Callable[[int, int], object] | None = None
        """Called with (offset, length) after a bulk OUT lands in SRAM: the copy engine's cue."""
        self.on_power: Callable[[bool], object] | None = None
        """Called with the new state when the host switches PCIe power (0xF3)."""
        self._link_up_at: float | None = None
        self._completion = bytes(8)
        self._arms: deque[_Arm] = deque()
        self._stream: _Stream | None = None
        self._queues: dict[int, deque[SimUrb]] = {EP_BULK_OUT: deque(), EP_BULK_IN: deque()}
        self._hung: set[SimUrb] = set()
        """URBs the device will never complete; only a discard (or an unplug) ends them."""
        self._stalled: set[SimUrb] = set()
        """Queued bulk URBs the device never serves (a USB_TIMEOUT): they block their endpoint."""
        self._cuts: dict[SimUrb, int] = {}
        """Queued bulk transfers a SHORT_TRANSFER fault will cut, and to what length."""
        self._gone = False
        self.requests: deque[tuple[str, int, int, int]] = deque(maxlen=1024)
        """The latest transfers, as (kind, request or endpoint, value or length, index): for
        protocol tests. Bounded, so a long simulation does not grow without limit."""

    # -- link state ----------------------------------------------------------------------------

    @property
    def powered(self) -> bool:
        return self._link_up_at is not None

    def _ltssm(self) -> int:
        if self._link_up_at is not None and self._clock() >= self._link_up_at:
            return LINK_UP
        return 0

    # -- transfers -----------------------------------------------------------------------------

    def submit(self, urb: SimUrb) -> None:
        """Take a transfer; it completes now, later, or (a fault) never."""
        kind = f"{'control' if urb.endpoint == 0 else 'bulk'}_{'in' if urb.is_in else 'out'}"
        size = urb.length if urb.is_in else len(urb.data)
        self.requests.append((kind, urb.request or urb.endpoint, urb.value or size, urb.index))
        if self._gone:
            self._reappear()
        if self.plan.check(Fault.DISCONNECT):
            self.unplug()
            urb.complete(UrbStatus.NO_DEVICE, error="the bridge is not on the bus")
            return
        if self.plan.check(Fault.USB_TIMEOUT):
            if urb.endpoint in self._queues:  # it holds back the transfers behind it
                self._stalled.add(urb)
                self._queues[urb.endpoint].append(urb)
            else:
                self._hang(urb)
            return
        carries_data = urb.is_in or len(urb.data) > 0
        rule = self.plan.check(Fault.SHORT_TRANSFER) if carries_data else None
        short = None if rule is None else rule.params.get("length", -1)
        cut = None if short is None else (int(short) if isinstance(short, int) else -1)
        if urb.endpoint == 0:
            try:
                self._control(urb, cut)
            except _Refused as exc:
                urb.complete(UrbStatus.STALL, error=str(exc))
            return
        queue = self._queues.get(urb.endpoint)
        if queue is None:
            urb.complete(UrbStatus.STALL, error=f"no endpoint 0x{urb.endpoint:02x}")
            return
        if cut is not None:
            self._cuts[urb] = cut
        queue.append(urb)
        self._serve(urb.endpoint)

    def discard(self, urb: SimUrb) -> None:
        """The host cancels a transfer in flight: it completes ``CANCELLED`` (a finished one is
        left as it was)."""
        if urb.done:
            return
        self._hung.discard(urb)
        self._stalled.discard(urb)
        queue = self._queues.get(urb.endpoint)
        if queue and urb in queue:
            if queue[0] is urb and self._arms and self._arms[0].read == urb.is_in:
                self._arms.popleft()  # the engine drops what it was armed for
            queue.remove(urb)
            self._cuts.pop(urb, None)
        urb.complete(UrbStatus.CANCELLED)
        if queue:
            self._serve(urb.endpoint)

    def _hang(self, urb: SimUrb) -> None:
        self._hung.add(urb)

    def _control(self, urb: SimUrb, cut: int | None) -> None:
        if urb.request_type not in (VENDOR_OUT, VENDOR_IN):
            raise _Refused(f"request type 0x{urb.request_type:02x}: only vendor requests")
        if urb.is_in:
            data = self._control_in(urb.request, urb.value, urb.length)
            data = data[: _short(cut, len(data))]
            urb.complete(UrbStatus.COMPLETED, actual=len(data), result=data)
            return
        if cut is not None:  # a cut data stage: the request is not carried out
            urb.complete(UrbStatus.COMPLETED, actual=_short(cut, len(urb.data)))
            return
        if self._control_out(urb.request, urb.value, urb.index, bytes(urb.data)):
            urb.complete(UrbStatus.COMPLETED, actual=len(urb.data))
        else:
            self._hang(urb)

    def _control_in(self, request: int, value: int, length: int) -> bytes:
        if request == 0xE4:
            if not (0 < length <= 0xFF and value + length <= XDATA_SIZE):
                raise _Refused(f"0xE4 read of {length} bytes at 0x{value:x}")
            self.xdata[LTSSM_XDATA] = self._ltssm()
            return bytes(self.xdata[value : value + length])
        if request == 0xF0:
            if length != 8:
                raise _Refused(f"0xF0 completion read of {length} bytes, expected 8")
            return self._completion
        raise _Refused(f"unknown vendor IN request 0x{request:x}")

    def _control_out(self, request: int, value: int, index: int, data: bytes) -> bool:
        """Carry out a vendor OUT request; False when the bridge hangs on it."""
        if request == 0xE5:
            if data or not (0 <= value < XDATA_SIZE and 0 <= index <= 0xFF):
                raise _Refused(f"0xE5 write of 0x{index:x} at 0x{value:x}")
            if value != LTSSM_XDATA:
                self.xdata[value] = index
        elif request == 0xF3:
            self._power(value == 1)
        elif request == 0xF0:
            return self._pcie_request(value, index, data)
        elif request == 0xF2:
            self._arm(value, index)
        else:
            raise _Refused(f"unknown vendor OUT request 0x{request:x}")
        return True

    def _power(self, on: bool) -> None:
        if not on:
            changed, self._link_up_at = self._link_up_at is not None, None
        elif self._link_up_at is None:  # powering on again does not retrain a link
            changed, self._link_up_at = True, self._clock() + self.link_latency
        else:
            changed = False
        if changed and self.on_power is not None:
            self.on_power(on)

    # -- the bulk endpoints --------------------------------------------------------------------

    def _serve(self, endpoint: int) -> None:
        """Finish the transfers at the head of ``endpoint`` that can finish now, in order."""
        queue = self._queues[endpoint]
        while queue:
            urb = queue[0]
            if urb in self._stalled:
                return
            try:
                finished = self._bulk_in(urb) if urb.is_in else self._bulk_out(urb)
            except _Refused as exc:
                queue.popleft()
                urb.complete(UrbStatus.STALL, error=str(exc))
                continue
            if not finished:
                return
            queue.popleft()

    def _bulk_out(self, urb: SimUrb) -> bool:
        cut = self._cuts.pop(urb, None)
        size = len(urb.data)
        accepted = _short(cut, size)
        stream = self._stream
        if stream is not None and stream.write:
            self._stream = None
            if size != stream.length:
                raise _Refused(f"bulk OUT of {size} bytes for a stream write of {stream.length}")
            self._route_write(stream.address, bytes(urb.data[:accepted]))
        elif self._arms and not self._arms[0].read:
            arm = self._arms.popleft()
            if size != arm.length:
                raise _Refused(f"bulk OUT of {size} bytes for an SRAM write armed for {arm.length}")
            self.sram[arm.offset : arm.offset + accepted] = urb.data[:accepted]
            if self.on_sram_write is not None:
                self.on_sram_write(arm.offset, accepted)
            if self.plan.check(Fault.USB_COMPLETION_LOST):
                self._hang(urb)  # the data is there; the host never hears of it
                return True
        else:
            raise _Refused("bulk OUT with no armed SRAM write or stream write")
        urb.complete(UrbStatus.COMPLETED, actual=accepted)
        return True

    def _bulk_in(self, urb: SimUrb) -> bool:
        length = urb.length
        stream = self._stream
        if stream is not None and not stream.write:
            self._stream = None
            if length != stream.length:
                raise _Refused(f"bulk IN of {length} bytes for a stream read of {stream.length}")
            data = self._route_read(stream.address, stream.length)
        elif self._arms and self._arms[0].read:
            arm = self._arms[0]
            if length != arm.length:
                self._arms.popleft()
                raise _Refused(f"bulk IN of {length} bytes for an SRAM read armed for {arm.length}")
            if not arm.released:
                return False  # the GPU's write to the cq page releases it
            self._arms.popleft()
            data = bytes(memoryview(self.sram)[arm.offset : arm.offset + arm.length])
        else:
            raise _Refused("bulk IN with no armed SRAM read or stream read")
        data = data[: _short(self._cuts.pop(urb, None), len(data))]
        urb.complete(UrbStatus.COMPLETED, actual=len(data), result=data)
        return True

    # -- reset and unplug ----------------------------------------------------------------------

    def _end_all(self, status: UrbStatus, error: str) -> None:
        pending = [*self._hung, *self._queues[EP_BULK_OUT], *self._queues[EP_BULK_IN]]
        self._hung.clear()
        self._stalled.clear()
        self._cuts.clear()
        for queue in self._queues.values():
            queue.clear()
        self._arms.clear()
        self._stream = None
        for urb in pending:
            urb.complete(status, error=error)

    def reset(self) -> None:
        """A USB reset: transfers in flight are cancelled, arms and streams forgotten (memory and
        power are kept)."""
        self._end_all(UrbStatus.CANCELLED, "USB reset")

    def unplug(self) -> None:
        """The bridge leaves the bus: transfers in flight fail with no device; on its return it is
        powered off and has forgotten every armed transfer (it re-enumerates from scratch)."""
        self._gone = True
        self._power(False)
        self._end_all(UrbStatus.NO_DEVICE, "the bridge went away")

    def _reappear(self) -> None:
        self._gone = False

    # -- the DMA engine ------------------------------------------------------------------------

    def _arm(self, value: int, index: int) -> None:
        sectors, read = value & 0x7FFF, bool(value & 0x8000)
        start, count = index & 0xFF, index >> 8
        offset, length = start * SLOT, sectors * SECTOR
        if not sectors or offset + length > SRAM_SIZE or length > count * SLOT:
            raise _Refused(
                f"0xF2 arm of {sectors} sectors at slot {start} ({count} slots) does not fit"
            )
        if len(self._arms) >= MAX_ARMS:
            raise _Refused(f"0xF2 arm with {MAX_ARMS} transfers already armed")
        self._arms.append(_Arm(read, offset, length))

    # -- PCIe ----------------------------------------------------------------------------------

    def _pcie_request(self, value: int, mode: int, data: bytes) -> bool:
        if len(data) != 12:
            raise _Refused(f"0xF0 request carries {len(data)} bytes, expected 12")
        low, high, word = struct.unpack("<III", data)
        address, fmt_type, byte_enables = high << 32 | low, value & 0xFF, (value >> 8) & 0xFF
        if mode in (1, 2):
            if fmt_type not in (_MWR32, _MWR64, _MRD32, _MRD64):
                raise _Refused(f"0xF0 streaming mode {mode} with TLP 0x{fmt_type:x}")
            if word == 0:
                return False  # a zero-length stream hangs the bridge (spec U15)
            if self._ltssm() != LINK_UP:
                raise _Refused("0xF0 stream with the PCIe link down")
            self._stream = _Stream(mode == 1, address, word * 4)
            if self._queues[EP_BULK_OUT if mode == 1 else EP_BULK_IN]:
                self._serve(EP_BULK_OUT if mode == 1 else EP_BULK_IN)
            return True
        if mode != 0:
            raise _Refused(f"0xF0 mode {mode}")
        posted = fmt_type in (_MWR32, _MWR64)
        if not posted and self.plan.check(Fault.TLP_RETRY_STORM):
            self._complete(0, CompletionStatus.SUCCESS, bridge_status=1)
            return True
        if self._ltssm() != LINK_UP:  # a posted write to a link that is down is simply lost
            if not posted:
                self._complete(0, CompletionStatus.UNSUPPORTED_REQUEST)
            return True
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
                raise _Refused(f"TLP fmt/type 0x{fmt_type:x} is not supported")
        except LookupError:
            self._complete(0, CompletionStatus.UNSUPPORTED_REQUEST)
        return True

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

    def _window(self, address: int, size: int) -> tuple[bytearray, int]:
        for base, memory, offset0 in (
            (SYS_PCIE, self.xdata, SYS_XDATA),
            (CQ_PCIE, self.cq, 0),
            (SRAM_PCIE, self.sram, 0),
        ):
            limit = SYS_SIZE if memory is self.xdata else len(memory)
            if base <= address and address + size <= base + limit:
                return memory, offset0 + address - base
        raise LookupError(f"no bridge memory at PCIe 0x{address:x}+{size}")

    def dma_write(self, address: int, data: bytes | memoryview) -> None:
        """A GPU write into bridge memory (sys page, cq page, SRAM)."""
        memory, offset = self._window(address, len(data))
        memory[offset : offset + len(data)] = data
        if memory is self.cq and offset <= 12 < offset + len(data) and self.cq[12:16] == bytes(4):
            for arm in self._arms:  # only an armed read can be released
                if arm.read and not arm.released:
                    arm.released = True
                    self._serve(EP_BULK_IN)
                    break

    def dma_read(self, address: int, size: int) -> memoryview:
        """A GPU read of bridge memory (a copy engine reading a sentinel or a chunk in SRAM)."""
        memory, offset = self._window(address, size)
        return memoryview(memory)[offset : offset + size]


def _short(short: int | None, length: int) -> int:
    """The length a transfer delivers: all of it, or what a SHORT_TRANSFER fault allows."""
    if short is None:
        return length
    return length // 2 if short < 0 else min(short, max(0, length - 1))

"""The simulated USB-PCIe bridge: what a host reaches through USB vendor requests and bulk endpoints.

It answers the wire protocol of :mod:`transports.protocol.bridge` (spec hardware-waits §4.2-4.4 and
§4.8), whose memory map and request formats it shares with the host side. What this module adds is
the bridge's behaviour: how transfers complete, in what order, and what goes wrong on a script.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aio_runtime import loop_clock

from ..protocol.bridge import (
    COMPLETION_SIZE,
    CQ_PCIE,
    CQ_SIZE,
    EP_BULK_IN,
    EP_BULK_OUT,
    LINK_UP,
    LTSSM_XDATA,
    MAX_XDATA_READ,
    SRAM_PCIE,
    SYS_PCIE,
    SYS_SIZE,
    SYS_XDATA,
    TLP_SIZE,
    XDATA_SIZE,
    StreamMode,
    Tlp,
    VendorRequest,
    unpack_tlp,
)
from ..usb.base import CONTROL_IN, CONTROL_OUT
from .faults import Fault, FaultPlan, FaultRule
from .pcie import PciePort, PcieTarget, Refused
from .sram import SramEngine
from .urb import SimUrb, UrbStatus

__all__ = ["SimBridge"]

_SINGLE, _WRITE, _STREAMS = StreamMode.SINGLE, StreamMode.WRITE, {StreamMode.WRITE, StreamMode.READ}


@dataclass
class _Stream:
    write: bool
    address: int
    length: int


class SimBridge:
    """The bridge's USB face: :meth:`submit` a :class:`SimUrb`, :meth:`discard` one in flight.

    Control requests complete when submitted. Bulk transfers are served in order per endpoint (a
    transfer that cannot finish holds back those behind it, as on a real endpoint). A bulk OUT takes
    the pending streaming write, else the oldest SRAM arm (which must be a write); its data lands in
    SRAM and the GPU is told (:attr:`on_sram_write`). A bulk IN takes the pending streaming read,
    else the oldest arm (a read), and completes only once the GPU has released that arm by writing 0
    to the cq page's dword +12 (:class:`~transports.sim.sram.SramEngine`). A discarded bulk
    transfer at the head of its endpoint drops the arm it would have used.

    The link trains ``link_latency`` seconds after PCIe power-on. The GPU side calls
    :meth:`dma_write` / :meth:`dma_read` for its accesses to bridge memory.
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
        self.pcie = PciePort(target, self.plan, lambda: self._ltssm() == LINK_UP)
        self.link_latency = link_latency
        self._clock = loop_clock()
        self.engine = SramEngine()
        self.xdata = bytearray(XDATA_SIZE)
        self.sram = self.engine.sram
        self.cq = bytearray(CQ_SIZE)
        self.on_sram_write: Callable[[int, int], object] | None = None
        """Called with (offset, length) after a bulk OUT lands in SRAM: the copy engine's cue."""
        self.on_power: Callable[[bool], object] | None = None
        """Called with the new state when the host switches PCIe power."""
        self._link_up_at: float | None = None
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
        self._in_requests: dict[int, Callable[[int, int], bytes]] = {
            VendorRequest.READ_XDATA: self._read_xdata,
            VendorRequest.PCIE: self._read_completion,
        }
        self._out_requests: dict[int, Callable[[int, int, bytes], bool]] = {
            VendorRequest.WRITE_XDATA: self._write_xdata,
            VendorRequest.POWER: self._power_request,
            VendorRequest.PCIE: self._pcie_request,
            VendorRequest.ARM_SRAM: self._arm,
        }

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
            self._disconnect(urb)
            return
        if self.plan.check(Fault.USB_TIMEOUT):
            self._never_answer(urb)
            return
        carries_data = urb.is_in or len(urb.data) > 0
        rule = self.plan.check(Fault.SHORT_TRANSFER) if carries_data else None
        cut = None if rule is None else _cut(rule)
        if urb.endpoint == 0:
            self._control(urb, cut)
        else:
            self._enqueue(urb, cut)

    def _disconnect(self, urb: SimUrb) -> None:
        """``DISCONNECT``: the bridge leaves the bus, and the transfer fails with no device."""
        self.unplug()
        urb.complete(UrbStatus.NO_DEVICE, error="the bridge is not on the bus")

    def _never_answer(self, urb: SimUrb) -> None:
        """``USB_TIMEOUT``: the device never answers the transfer."""
        if urb.endpoint in self._queues:  # it holds back the transfers behind it
            self._stalled.add(urb)
            self._queues[urb.endpoint].append(urb)
        else:
            self._hang(urb)

    def _enqueue(self, urb: SimUrb, cut: int | None) -> None:
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
            if queue[0] is urb and self.engine.armed(read=urb.is_in):
                self.engine.drop()
            queue.remove(urb)
            self._cuts.pop(urb, None)
        urb.complete(UrbStatus.CANCELLED)
        if queue:
            self._serve(urb.endpoint)

    def _hang(self, urb: SimUrb) -> None:
        self._hung.add(urb)

    # -- vendor requests -----------------------------------------------------------------------

    def _control(self, urb: SimUrb, cut: int | None) -> None:
        try:
            if urb.request_type not in (CONTROL_OUT, CONTROL_IN):
                raise Refused(f"request type 0x{urb.request_type:02x}: only vendor requests")
            if urb.is_in:
                data = self._control_in(urb.request, urb.value, urb.length)
                data = data[: _short(cut, len(data))]
                urb.complete(UrbStatus.COMPLETED, actual=len(data), result=data)
            elif cut is not None:  # a cut data stage: the request is not carried out
                urb.complete(UrbStatus.COMPLETED, actual=_short(cut, len(urb.data)))
            elif self._control_out(urb.request, urb.value, urb.index, bytes(urb.data)):
                urb.complete(UrbStatus.COMPLETED, actual=len(urb.data))
            else:
                self._hang(urb)
        except Refused as exc:
            urb.complete(UrbStatus.STALL, error=str(exc))

    def _control_in(self, request: int, value: int, length: int) -> bytes:
        handler = self._in_requests.get(request)
        if handler is None:
            raise Refused(f"unknown vendor IN request 0x{request:x}")
        return handler(value, length)

    def _control_out(self, request: int, value: int, index: int, data: bytes) -> bool:
        """Carry out a vendor OUT request; False when the bridge hangs on it."""
        handler = self._out_requests.get(request)
        if handler is None:
            raise Refused(f"unknown vendor OUT request 0x{request:x}")
        return handler(value, index, data)

    def _read_xdata(self, address: int, length: int) -> bytes:
        if not (0 < length <= MAX_XDATA_READ and address + length <= XDATA_SIZE):
            raise Refused(f"0x{VendorRequest.READ_XDATA:X} read of {length} bytes at 0x{address:x}")
        self.xdata[LTSSM_XDATA] = self._ltssm()
        return bytes(self.xdata[address : address + length])

    def _read_completion(self, _value: int, length: int) -> bytes:
        if length != COMPLETION_SIZE:
            raise Refused(
                f"0x{VendorRequest.PCIE:X} completion read of {length} bytes, "
                f"expected {COMPLETION_SIZE}"
            )
        return self.pcie.completion

    def _write_xdata(self, address: int, byte: int, data: bytes) -> bool:
        if data or not (0 <= address < XDATA_SIZE and 0 <= byte <= 0xFF):
            raise Refused(f"0x{VendorRequest.WRITE_XDATA:X} write of 0x{byte:x} at 0x{address:x}")
        if address != LTSSM_XDATA:
            self.xdata[address] = byte
        return True

    def _power_request(self, value: int, _index: int, _data: bytes) -> bool:
        self._power(value == 1)
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
            except Refused as exc:
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
                raise Refused(f"bulk OUT of {size} bytes for a stream write of {stream.length}")
            self.pcie.write(stream.address, bytes(urb.data[:accepted]))
        elif self.engine.armed(read=False):
            offset = self.engine.write(urb.data, accepted)
            if self.on_sram_write is not None:
                self.on_sram_write(offset, accepted)
            if self.plan.check(Fault.USB_COMPLETION_LOST):
                self._hang(urb)  # the data is there; the host never hears of it
                return True
        else:
            raise Refused("bulk OUT with no armed SRAM write or stream write")
        urb.complete(UrbStatus.COMPLETED, actual=accepted)
        return True

    def _bulk_in(self, urb: SimUrb) -> bool:
        length = urb.length
        stream = self._stream
        if stream is not None and not stream.write:
            self._stream = None
            if length != stream.length:
                raise Refused(f"bulk IN of {length} bytes for a stream read of {stream.length}")
            data = self.pcie.read(stream.address, stream.length)
        elif self.engine.armed(read=True):
            released = self.engine.read(length)
            if released is None:
                return False
            data = released
        else:
            raise Refused("bulk IN with no armed SRAM read or stream read")
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
        self.engine.clear()
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

    # -- the DMA engine's requests ---------------------------------------------------------------

    def _arm(self, value: int, index: int, _data: bytes) -> bool:
        self.engine.arm(value, index)
        return True

    # -- PCIe ----------------------------------------------------------------------------------

    def _pcie_request(self, value: int, mode: int, data: bytes) -> bool:
        if len(data) != TLP_SIZE:
            raise Refused(
                f"0x{VendorRequest.PCIE:X} request carries {len(data)} bytes, expected {TLP_SIZE}"
            )
        tlp = unpack_tlp(value, data)
        if mode in _STREAMS:
            return self._stream_request(tlp, mode)
        if mode != _SINGLE:
            raise Refused(f"0x{VendorRequest.PCIE:X} mode {mode}")
        self.pcie.request(tlp)
        return True

    def _stream_request(self, tlp: Tlp, mode: int) -> bool:
        """A streaming write or read: the data follows on a bulk endpoint; False when the bridge
        hangs on it."""
        if tlp.kind is None or not tlp.kind.is_memory:
            raise Refused(
                f"0x{VendorRequest.PCIE:X} streaming mode {mode} with TLP 0x{tlp.fmt_type:x}"
            )
        if tlp.word == 0:
            return False  # a zero-length stream hangs the bridge (spec U15)
        if self._ltssm() != LINK_UP:
            raise Refused(f"0x{VendorRequest.PCIE:X} stream with the PCIe link down")
        write = mode == _WRITE
        self._stream = _Stream(write, tlp.address, tlp.word * 4)
        endpoint = EP_BULK_OUT if write else EP_BULK_IN
        if self._queues[endpoint]:
            self._serve(endpoint)
        return True

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
        view = memoryview(data).cast("B")
        memory, offset = self._window(address, len(view))
        memoryview(memory)[offset : offset + len(view)] = view  # one copy
        if memory is self.cq and offset <= 12 < offset + len(data) and self.cq[12:16] == bytes(4):
            if self.engine.release():
                self._serve(EP_BULK_IN)

    def dma_read(self, address: int, size: int) -> memoryview:
        """A GPU read of bridge memory (a copy engine reading a sentinel or a chunk in SRAM)."""
        memory, offset = self._window(address, size)
        return memoryview(memory)[offset : offset + size]


def _cut(rule: FaultRule) -> int:
    """Where a ``SHORT_TRANSFER`` rule cuts a transfer that carries data (-1: in half)."""
    short = rule.params.get("length", -1)
    return int(short) if isinstance(short, int) else -1


def _short(short: int | None, length: int) -> int:
    """The length a transfer delivers: all of it, or what a SHORT_TRANSFER fault allows."""
    if short is None:
        return length
    return length // 2 if short < 0 else min(short, max(0, length - 1))

"""The host side of the USB-PCIe bridge: controller memory, PCIe requests, the SRAM DMA engine,
power and link bring-up — every step bounded, over any :class:`~transports.usb.UsbTransport`.

Request formats are those of :mod:`transports.protocol.bridge` (spec hardware-waits §4.3-4.4).
Each vendor request is one USB transfer with its own timeout: ``control_timeout`` (1 s), power
``power_timeout`` (10 s), the bulk stage of a stream ``bulk_timeout`` (10 s). A PCIe request is
bounded as a whole by ``request_timeout`` (its transfers and its retries):
:class:`aio_runtime.PcieRequestTimeout` when that runs out. The bridge answers "busy, retry" with a
non-zero return status; the request is repeated ``retry_interval`` apart, at most ``retries`` times,
then fails with :class:`PcieRetriesExhausted`. A completion status other than success fails at
once with :class:`PcieCompletionError` (unsupported request, completer abort, configuration retry).

The bridge pairs the parts of a request by order, so requests made of several transfers must not
interleave with another task's. Three :class:`Channel` s keep them apart: ``out_pipe`` (a stream
write or an SRAM arm, and the bulk OUT data that goes with it — the copy protocol holds it for a
whole copy-in batch, with two transfers in flight), ``in_pipe`` (a stream read or an armed SRAM
read, and its bulk IN) and ``completion`` (a TLP and the read of its completion). Single transfers
(posted writes, controller memory) need none. Waiting for a channel is bounded by
``channel_timeout``, longer than any holder keeps one, so a stuck holder fails before those waiting
behind it; a timeout names the holder. :meth:`BridgeClient.exclusive` takes all three (for a USB
reset). A request's own bound (``request_timeout``) starts once it has its channel.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable

import anyio

from aio_runtime import (
    HardwareTimeout,
    Layer,
    PcieRequestTimeout,
    PollPolicy,
    TransferError,
    WaitBound,
    wait_until,
)

from .protocol.bridge import (
    COMPLETION_SIZE,
    EP_BULK_IN,
    EP_BULK_OUT,
    LINK_UP,
    LTSSM_XDATA,
    MAX_XDATA_READ,
    SECTOR,
    SLOT,
    SRAM_SLOTS,
    PcieCompletion,
    StreamMode,
    TlpType,
    VendorRequest,
    byte_enables,
    completion_name,
    config_address,
    pack_arm,
    pack_tlp,
    unpack_completion,
)
from .usb import CONTROL_IN, CONTROL_OUT, UsbTransport

__all__ = ["BridgeClient", "Channel", "PcieCompletionError", "PcieRetriesExhausted"]


class PcieCompletionError(TransferError):
    """A PCIe request completed with a status other than success."""

    default_layer = Layer.PCIE_REQUEST

    def __init__(self, message: str, *, status: int, awaited: str = "") -> None:
        super().__init__(message, awaited=awaited)
        self.status = status


class PcieRetriesExhausted(TransferError):
    """The bridge kept answering "busy, retry" to a PCIe request."""

    default_layer = Layer.PCIE_REQUEST


class Channel:
    """Exclusive use of a resource shared by tasks, with who holds it.

    Waiting for it is bounded by ``timeout`` — chosen longer than any holder keeps it (each
    holder's own steps are bounded), so that when a holder is stuck it fails first and the waiter
    is only delayed — or by the enclosing deadline; reaching the bound raises ``error`` naming the
    holder. Channels are always taken in one order (the session's queue channels, then the bulk
    OUT pipe, the bulk IN pipe, the completion register), so two holders never wait on each other.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float,
        error: type[HardwareTimeout] = PcieRequestTimeout,
        layer: Layer | None = None,
    ) -> None:
        self.name = name
        self.timeout = timeout
        self.error = error
        self.layer = layer
        self.holder = ""
        self._lock = anyio.Lock(fast_acquire=True)

    @property
    def held(self) -> bool:
        return self._lock.locked()

    @contextlib.asynccontextmanager
    async def hold(self, holder: str) -> AsyncIterator[None]:
        try:  # free: taken at once, with no bound to set up (the body's waits are bounded)
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            awaited = f"{self.name} for {holder} (held by {self.holder or 'nobody'})"
            bound = WaitBound(
                awaited=awaited, error=self.error, timeout=self.timeout, layer=self.layer
            )
            await bound.run(self._lock.acquire(), awaited=awaited)
        self.holder = holder
        try:
            yield
        finally:
            self.holder = ""
            self._lock.release()


class BridgeClient:
    """Drives one bridge through a USB transport."""

    def __init__(
        self,
        usb: UsbTransport,
        *,
        control_timeout: float = 1.0,
        request_timeout: float = 5.0,
        power_timeout: float = 10.0,
        bulk_timeout: float = 10.0,
        channel_timeout: float = 30.0,
        retries: int = 10,
        retry_interval: float = 0.001,
    ) -> None:
        self.usb = usb
        self.control_timeout = control_timeout
        self.request_timeout = request_timeout
        self.power_timeout = power_timeout
        self.bulk_timeout = bulk_timeout
        self.retries = retries
        self.out_pipe = Channel("the bridge's bulk OUT pipe", timeout=channel_timeout)
        self.in_pipe = Channel("the bridge's bulk IN pipe", timeout=channel_timeout)
        self.completion = Channel("the bridge's completion register", timeout=channel_timeout)
        self._retry_policy = PollPolicy(
            spin=0, first_interval=retry_interval, max_interval=retry_interval
        )

    # -- controller memory -----------------------------------------------------------------

    async def read_xdata(self, address: int, length: int) -> bytes:
        """Read controller memory (up to :data:`MAX_XDATA_READ` bytes per request)."""
        parts = []
        for offset in range(0, length, MAX_XDATA_READ):
            size = min(MAX_XDATA_READ, length - offset)
            parts.append(
                await self.usb.control_in(
                    CONTROL_IN,
                    VendorRequest.READ_XDATA,
                    address + offset,
                    0,
                    size,
                    timeout=self.control_timeout,
                )
            )
        return b"".join(parts)

    async def write_xdata(self, address: int, data: bytes) -> None:
        """Write controller memory, one request per byte."""
        for offset, byte in enumerate(data):
            await self.usb.control_out(
                CONTROL_OUT,
                VendorRequest.WRITE_XDATA,
                address + offset,
                byte,
                timeout=self.control_timeout,
            )

    # -- power and link --------------------------------------------------------------------

    async def link_state(self) -> int:
        return (await self.read_xdata(LTSSM_XDATA, 1))[0]

    async def power(self, on: bool) -> None:
        await self.usb.control_out(
            CONTROL_OUT, VendorRequest.POWER, int(on), 0, timeout=self.power_timeout
        )

    async def bring_up_link(self, *, timeout: float) -> None:
        """Power the PCIe side on if the link is down, then wait for the link to train — all of
        it within ``timeout``."""
        bound = WaitBound(awaited="PCIe link up", error=PcieRequestTimeout, timeout=timeout)
        if await bound.run(self.link_state(), awaited="PCIe link state") == LINK_UP:
            return
        await bound.run(self.power(True), awaited="PCIe power on")
        await wait_until(
            self.link_state,
            lambda state: state == LINK_UP,
            awaited="PCIe link up (LTSSM byte)",
            within=bound,
            expected=LINK_UP,
        )

    # -- PCIe requests ---------------------------------------------------------------------

    def _send(
        self,
        fmt_type: int,
        address: int,
        word: int,
        enables: int = 0,
        mode: StreamMode = StreamMode.SINGLE,
    ) -> Awaitable[None]:
        """The request's control transfer, to await (made here, not in a coroutine of its own:
        every PCIe request takes this path)."""
        value, data = pack_tlp(fmt_type, address, word, enables)
        return self.usb.control_out(
            CONTROL_OUT, VendorRequest.PCIE, value, mode, data, timeout=self.control_timeout
        )

    async def _request(
        self, fmt_type: int, address: int, word: int, enables: int, awaited: str
    ) -> int:
        """One TLP with a completion: issue, read the completion, retry while the bridge is busy."""
        async with self.completion.hold(awaited):
            return await self._request_held(fmt_type, address, word, enables, awaited)

    async def _request_held(
        self, fmt_type: int, address: int, word: int, enables: int, awaited: str
    ) -> int:
        bound = WaitBound(awaited=awaited, error=PcieRequestTimeout, timeout=self.request_timeout)
        attempts = 0

        async def attempt() -> PcieCompletion:
            nonlocal attempts
            attempts += 1
            if attempts > self.retries + 1:
                raise PcieRetriesExhausted(
                    f"{awaited}: the bridge answered 'retry' {self.retries + 1} times",
                    awaited=awaited,
                )
            await bound.run(
                self._send(fmt_type, address, word, enables), awaited=f"{awaited}: request"
            )
            raw = await bound.run(
                self.usb.control_in(
                    CONTROL_IN,
                    VendorRequest.PCIE,
                    0,
                    0,
                    COMPLETION_SIZE,
                    timeout=self.control_timeout,
                ),
                awaited=f"{awaited}: completion",
            )
            return unpack_completion(raw)

        completion = await wait_until(
            attempt,
            lambda completion: completion.bridge_status == 0,
            awaited=f"{awaited}: bridge accepts the request",
            within=bound,
            policy=self._retry_policy,
        )
        if completion.status:
            status = completion.status
            raise PcieCompletionError(
                f"{awaited}: completion status {status} ({completion_name(status)})",
                status=status,
                awaited=awaited,
            )
        return int(completion.data)

    async def config_read(self, bus: int, device: int, function: int, register: int) -> int:
        """A configuration read of one dword (type 1 past bus 0)."""
        awaited = f"PCIe config read {bus:02x}:{device:02x}.{function} +0x{register:x}"
        address = config_address(bus, device, function, register)
        return await self._request(TlpType.config(bus, write=False), address, 0, 0xF, awaited)

    async def config_write(
        self, bus: int, device: int, function: int, register: int, value: int, size: int = 4
    ) -> None:
        awaited = f"PCIe config write {bus:02x}:{device:02x}.{function} +0x{register:x}"
        enables = byte_enables(register, size)
        shifted = (value << (8 * (register & 3))) & 0xFFFFFFFF
        address = config_address(bus, device, function, register)
        await self._request(TlpType.config(bus, write=True), address, shifted, enables, awaited)

    async def mem_read(self, address: int, size: int = 4) -> int:
        """A memory read of 1, 2 or 4 bytes (MMIO)."""
        enables = byte_enables(address, size)
        awaited = f"PCIe memory read 0x{address:x} ({size} bytes)"
        word = await self._request(
            TlpType.memory(address, write=False), address & ~3, 0, enables, awaited
        )
        return (word >> (8 * (address & 3))) & ((1 << (8 * size)) - 1)

    async def mem_write(self, address: int, value: int, size: int = 4) -> None:
        """A posted memory write of 1, 2 or 4 bytes (MMIO)."""
        enables = byte_enables(address, size)
        shifted = (value << (8 * (address & 3))) & 0xFFFFFFFF
        await self._send(TlpType.memory(address, write=True), address & ~3, shifted, enables)

    async def write_stream(self, address: int, data: bytes | bytearray | memoryview) -> None:
        """A streaming memory write: the data rides the bulk OUT endpoint."""
        if not data or len(data) % 4 or address & 3:
            raise ValueError("a streaming write moves whole, aligned dwords")
        awaited = f"PCIe streaming write 0x{address:x} ({len(data)} bytes)"
        async with self.out_pipe.hold(awaited):
            bound = await self._start_stream(address, len(data), StreamMode.WRITE, awaited)
            await bound.run(
                self.usb.bulk_out(EP_BULK_OUT, data, timeout=self.bulk_timeout),
                awaited=f"{awaited}: data",
            )

    async def read_stream(self, address: int, length: int) -> bytes:
        """A streaming memory read: the data comes back on the bulk IN endpoint."""
        if not length or length % 4 or address & 3:
            raise ValueError("a streaming read moves whole, aligned dwords")
        awaited = f"PCIe streaming read 0x{address:x} ({length} bytes)"
        async with self.in_pipe.hold(awaited):
            bound = await self._start_stream(address, length, StreamMode.READ, awaited)
            return await bound.run(
                self.usb.bulk_in(EP_BULK_IN, length, timeout=self.bulk_timeout),
                awaited=f"{awaited}: data",
            )

    async def _start_stream(
        self, address: int, length: int, mode: StreamMode, awaited: str
    ) -> WaitBound:
        """Send a stream's request (the caller holds its pipe); the stream's bound, for its data."""
        bound = WaitBound(awaited=awaited, error=PcieRequestTimeout, timeout=self.request_timeout)
        fmt_type = TlpType.memory(address, write=mode is StreamMode.WRITE)
        await bound.run(
            self._send(fmt_type, address, length // 4, mode=mode), awaited=f"{awaited}: request"
        )
        return bound

    @contextlib.asynccontextmanager
    async def exclusive(self, holder: str) -> AsyncIterator[None]:
        """Hold every channel: nobody else has a paired request in progress. (A single transfer
        of another task — a posted write, a controller-memory read — can still be in flight: a
        USB reset made meanwhile cancels it, and that task sees a transfer error.)"""
        async with (
            self.out_pipe.hold(holder),
            self.in_pipe.hold(holder),
            self.completion.hold(holder),
        ):
            yield

    # -- the SRAM DMA engine ---------------------------------------------------------------

    async def arm_sram(self, *, read: bool, slot: int, length: int) -> None:
        """Arm the DMA engine for the next bulk transfer of ``length`` bytes at ``slot`` (the
        caller holds the matching pipe until that transfer has completed)."""
        if length <= 0 or length % SECTOR:
            raise ValueError(f"SRAM transfers move whole 512-byte sectors, got {length}")
        count = -(-length // SLOT)
        if not (0 <= slot and slot + count <= SRAM_SLOTS):
            raise ValueError(f"{length} bytes at slot {slot} do not fit the 32-slot SRAM")
        value, index = pack_arm(read, slot, count, length // SECTOR)
        await self.usb.control_out(
            CONTROL_OUT, VendorRequest.ARM_SRAM, value, index, timeout=self.control_timeout
        )

"""The double-buffered copy protocol between host memory and VRAM over the bridge (spec
hardware-waits §4.6), with every wait bounded and every failure typed by layer.

Copy-in: the payload travels in chunks of :data:`CHUNK` bytes through the two 256 KiB halves of
bridge SRAM. Chunk ``n`` goes to half ``n & 1``: its wire image — payload, then a 512-byte block
whose last dword (the half's last) holds ``sentinel(n)`` — sits at the end of the half. The host
arms the DMA engine (0xF2) and sends the image as a bulk OUT; up to two are in flight, one per
half. The copy engine, programmed for the whole batch before the first chunk is sent, waits for
each sentinel, copies the payload to VRAM, clears the sentinel and writes ``n + 1`` to the chunk
fence in the bridge's sys page, which the host reads (one byte, 0xE4) before it reuses a half.

Copy-out: per chunk (up to 2 x CHUNK, the two halves) the host arms an SRAM read, pokes
``usb_go = n + 1`` into VRAM and receives the data with a bulk IN, which the bridge completes only
once the copy engine has filled SRAM and written 0 to the cq page (the release).

A copy-out may be queued behind a kernel (:class:`After`): its program first waits, on the
device, for the kernel's release of its timeline value, so the first chunk's bulk IN completes
only once the kernel has finished and its output is in SRAM — the bulk IN is the kernel's fence
(spec hardware-waits U8: the host needs no poll of the timeline to learn that it finished).

Two failures that look alike are told apart by layer:

- a copy-in chunk whose bulk OUT never completes although the GPU advanced the fence past it →
  :class:`aio_runtime.UsbTransferTimeout` (USB transfer: the completion was lost), while a
  transfer that completed with the fence stuck → :class:`aio_runtime.SignalTimeout` (GPU queue);
- a copy-out bulk IN that times out after the GPU finished the chunk → ``UsbTransferTimeout``
  (the release never came), before it → ``SignalTimeout`` (the copy engine never did the chunk);
  queued behind a kernel that has not released its value → ``SignalTimeout`` for that value.

A halted copy engine (its watchdog) or a device in its error state is reported as
:class:`GpuFault`. After any failure the next copy first restores a known state: transfers
cancelled and awaited, the USB endpoints reset (arms dropped), the copy engine reset, both
sentinel slots zeroed and the fence reset — a stale sentinel cannot match a new chunk.

Batches hold at most :data:`MAX_BATCH` chunks, so the one-byte fence compares unambiguously.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio

from aio_runtime import (
    BudgetExhausted,
    Layer,
    PollPolicy,
    RuntimeFault,
    SignalTimeout,
    UsbTransferTimeout,
    serial_reached,
    wait_until,
)

from ..bridge import BridgeClient
from ..errors import GpuFault
from ..protocol import gpu as hw
from ..protocol.bridge import (
    CQ_RELEASE_PCIE,
    EP_BULK_IN,
    EP_BULK_OUT,
    FENCE_PCIE,
    FENCE_XDATA,
    SECTOR,
    SLOT,
    SRAM_PCIE,
    SRAM_SIZE,
)
from ..usb import UsbTransfer
from .buffers import Bytes, Gather
from .queues import Packets, Ring

__all__ = ["CHUNK", "HALF", "MAX_BATCH", "After", "CopyProtocol", "CopyStatistics", "sentinel"]

HALF, CHUNK = SRAM_SIZE // 2, SRAM_SIZE // 2 - SECTOR
MAX_BATCH = 128
_FENCE_BITS = 8
"""The host reads one byte of the chunk fence and compares it as a serial number: never wrongly,
since a batch holds at most :data:`MAX_BATCH` chunks, half the byte's range."""
_FENCE_POLICY = PollPolicy(yield_first=True)
"""A fence read is a control transfer; the copy engine that moves the fence on usually runs as
soon as the host yields (at once on real hardware, on the next loop pass in the simulator)."""


def sentinel(n: int) -> int:
    return 0x5100_0000 | (n & 0xFF_FFFF)


def _wire_in(size: int) -> int:
    return -(-(size + SECTOR) // SLOT) * SLOT


@dataclass(frozen=True)
class After:
    """What a copy-out waits for on the device before it starts: the dword at ``address`` (a
    kernel's timeline value, in VRAM) reaching ``value`` (an unsigned 32-bit compare, as the copy
    engine's POLL makes it). The host waits for the first chunk up to ``timeout`` (the kernel's
    bound) instead of the bulk transfer bound; ``awaited`` names that wait in its error."""

    address: int
    value: int
    timeout: float
    awaited: str


@dataclass
class CopyStatistics:
    """What crossed the protocol, counted when the GPU had it (copy-in) or the host did
    (copy-out)."""

    bytes_in: int = 0
    chunks_in: int = 0
    bytes_out: int = 0
    chunks_out: int = 0
    restores: int = 0


class CopyProtocol:
    """Copies between host memory and VRAM through one bridge and the GPU's copy queue.

    ``bulk_timeout`` bounds each bulk transfer, ``fence_timeout`` each wait on the chunk fence;
    an enclosing :func:`aio_runtime.deadline_scope` bounds a whole copy. One copy runs at a time
    (the caller serialises them: the device session does).
    """

    def __init__(
        self,
        bridge: BridgeClient,
        ring: Ring,
        *,
        usb_go: int,
        status: int,
        bulk_timeout: float = 10.0,
        fence_timeout: float = 10.0,
    ) -> None:
        self.bridge = bridge
        self.usb = bridge.usb
        self.ring = ring
        self.usb_go = usb_go
        self.status = status
        self.bulk_timeout = bulk_timeout
        self.fence_timeout = fence_timeout
        self.stats = CopyStatistics()
        self._staging = bytearray(2 * HALF)
        self._dirty = True
        self._fence_seen = 0
        """The fence as last read (within the current batch)."""
        self._arm_unused = False
        """An SRAM arm went out and its bulk transfer may not have (set until it is submitted)."""

    # -- known state ---------------------------------------------------------------------------

    async def restore(self) -> None:
        """Start from a known state: USB endpoints reset (arms dropped, transfers cancelled), the
        copy engine reset, ``usb_go`` and the fence at 0, both sentinel slots zeroed. Holds the
        whole bridge meanwhile: a USB reset cancels every task's transfers."""
        bridge = self.bridge
        async with bridge.exclusive("a copy-protocol restore"):
            await self.usb.reset(timeout=bridge.control_timeout)
            await self.ring.reset()
            await bridge.mem_write(self.usb_go, 0)
            zeros = bytes(SLOT)
            for slot in (HALF // SLOT - 1, 2 * HALF // SLOT - 1):
                await bridge.arm_sram(read=False, slot=slot, length=SLOT)
                await self.usb.bulk_out(EP_BULK_OUT, zeros, timeout=self.bulk_timeout)
            await bridge.write_xdata(FENCE_XDATA, b"\0")
            self._fence_seen = 0
        self._dirty = False
        self.stats.restores += 1

    async def _stop(self) -> None:
        """A batch failed or was cancelled: stop the copy engine now (its program would otherwise
        keep polling until its watchdog put the device in its error state), clear ``usb_go``,
        and drop an SRAM arm that may have no transfer behind it (a USB reset), so that nobody
        else's bulk data is taken for SRAM. Shielded and bounded; the next copy restores the rest
        (the batch is left dirty, whoever cleared the flag meanwhile)."""
        self._dirty = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.bridge.request_timeout):
            with contextlib.suppress(RuntimeFault):  # a device that is gone: restore() says so
                await self.ring.reset()
                await self.bridge.mem_write(self.usb_go, 0)
                if self._arm_unused:
                    async with self.bridge.exclusive("dropping an unused SRAM arm"):
                        await self.usb.reset(timeout=self.bridge.control_timeout)
                    self._arm_unused = False

    @contextlib.asynccontextmanager
    async def _batch(self) -> AsyncIterator[None]:
        if self._dirty:
            await self.restore()
        else:  # the previous batch drained: its fence count goes back to 0 (spec §4.6 step 1)
            await self.bridge.write_xdata(FENCE_XDATA, b"\0")
            self._fence_seen = 0
        self._dirty = True
        try:
            yield
        except BaseException:
            await self._stop()
            raise
        self._dirty = False

    # -- the fence -----------------------------------------------------------------------------

    async def _fence(self) -> int:
        self._fence_seen = (await self.bridge.read_xdata(FENCE_XDATA, 1))[0]
        return self._fence_seen

    async def _drained(self, count: int, what: str) -> None:
        """Wait until the fence shows ``count`` chunks done (one byte, compared modulo 256). A
        fence already seen that far is not read again: the engine often runs a chunk ahead."""
        if serial_reached(self._fence_seen, count, bits=_FENCE_BITS):
            return
        try:
            await wait_until(
                self._fence,
                lambda fence: serial_reached(fence, count, bits=_FENCE_BITS),
                awaited=f"chunk fence >= {count} ({what})",
                error=SignalTimeout,
                layer=Layer.GPU_QUEUE,
                timeout=self.fence_timeout,
                expected=count & 0xFF,
                policy=_FENCE_POLICY,
            )
        except SignalTimeout as exc:
            await self._diagnose(exc)
            raise

    async def _diagnose(self, exc: BaseException) -> None:
        """A copy-engine wait failed: if the engine halted or the device is in its error state,
        say so with a :class:`GpuFault` (chained to the timeout)."""
        halted = error = 0
        with contextlib.suppress(Exception):  # a diagnosis that fails leaves the timeout as is
            halted = await self.ring.read(hw.RB_STATUS) & hw.STATUS_HALTED
            error = await self.bridge.mem_read(self.status + hw.STATUS_ERROR)
        if halted or error:
            reason = "halted by its watchdog" if halted else f"device error state 0x{error:x}"
            raise GpuFault(f"copy engine {reason}", source=error) from exc

    # -- copy-in -------------------------------------------------------------------------------

    async def copy_in(self, target: int, *parts: Bytes) -> None:
        """Copy ``parts`` (one, or several laid back to back) to VRAM at bus address
        ``target``; returns once the GPU has them."""
        payload = Gather([memoryview(part).cast("B") for part in parts])
        step = CHUNK * MAX_BATCH
        for offset in range(0, len(payload), step):
            await self._copy_in_batch(target + offset, payload.part(offset, offset + step))

    async def _copy_in_batch(self, target: int, view: Gather) -> None:
        sizes = [min(CHUNK, len(view) - o) for o in range(0, len(view), CHUNK)]
        program = Packets()
        for n, size in enumerate(sizes):
            end = (n & 1) * HALF + HALF
            wire = _wire_in(size)
            program.poll(SRAM_PCIE + end - 4, sentinel(n), equal=True)
            program.copy(SRAM_PCIE + end - wire, target + n * CHUNK, size)
            program.write(SRAM_PCIE + end - 4, 0)
            program.fence(FENCE_PCIE, n + 1)
        in_flight: deque[tuple[int, UsbTransfer[None]]] = deque()
        async with self._batch():
            await self.ring.submit(program)
            async with self.bridge.out_pipe.hold(f"copy-in of {len(view)} bytes"):
                try:
                    await self._send_chunks(view, sizes, in_flight)
                finally:
                    while in_flight:  # oldest first, as the pipe serves them
                        await in_flight.popleft()[1].cancel()
            await self._drained(len(sizes), f"copy-in of {len(view)} bytes")
        self.stats.bytes_in += len(view)
        self.stats.chunks_in += len(sizes)

    async def _send_chunks(
        self, view: Gather, sizes: list[int], in_flight: deque[tuple[int, UsbTransfer[None]]]
    ) -> None:
        """Stage, arm and send each chunk, two in flight (oldest first in ``in_flight``); reap
        them all. The caller holds the bulk OUT pipe."""
        for n, size in enumerate(sizes):
            if len(in_flight) == 2:  # this half's previous occupant: chunk n - 2
                await self._reap(*in_flight[0])
                in_flight.popleft()
            half = n & 1
            end = half * HALF + HALF
            wire = _wire_in(size)
            start = end - wire
            view.copy_into(self._staging, start, n * CHUNK, size)
            self._staging[end - 4 : end] = sentinel(n).to_bytes(4, "little")
            if n >= 2:
                await self._drained(n - 1, f"copy-in chunk {n - 2} before reusing its half")
            self._arm_unused = True
            await self.bridge.arm_sram(read=False, slot=start // SLOT, length=wire)
            transfer = self.usb.submit_bulk_out(
                EP_BULK_OUT, memoryview(self._staging)[start:end], timeout=self.bulk_timeout
            )
            self._arm_unused = False
            in_flight.append((n, transfer))
        while in_flight:
            await self._reap(*in_flight[0])
            in_flight.popleft()

    async def _reap(self, n: int, transfer: UsbTransfer[None]) -> None:
        try:
            await transfer.wait()
        except UsbTransferTimeout as exc:
            with contextlib.suppress(Exception):
                fence = await self._fence()
                if serial_reached(fence, n + 1, bits=_FENCE_BITS):
                    exc.add_note(
                        f"the GPU consumed copy-in chunk {n} (fence {fence}): "
                        "the USB completion was lost"
                    )
            raise

    # -- copy-out ------------------------------------------------------------------------------

    async def copy_out(
        self,
        source: int,
        size: int,
        out: bytearray | memoryview | None = None,
        *,
        after: After | None = None,
    ) -> bytearray | memoryview:
        """Copy ``size`` bytes of VRAM at bus address ``source`` into ``out`` (or a new
        bytearray, returned); ``after``: once the device has seen that dword reach its value."""
        result = bytearray(size) if out is None else out
        target = memoryview(result).cast("B")
        if len(target) < size:
            raise ValueError(f"the destination holds {len(target)} bytes, {size} needed")
        step = 2 * CHUNK * MAX_BATCH
        for offset in range(0, size, step):
            part = min(step, size - offset)
            first = after if offset == 0 else None
            await self._copy_out_batch(source + offset, target[offset : offset + part], first)
        return result

    async def _copy_out_batch(self, source: int, target: memoryview, after: After | None) -> None:
        sizes = [min(2 * CHUNK, len(target) - o) for o in range(0, len(target), 2 * CHUNK)]
        program = Packets()
        if after is not None:
            program.poll(after.address, after.value, equal=False)
        for n, size in enumerate(sizes):
            first = min(size, CHUNK)
            program.poll(self.usb_go, n + 1, equal=False)
            program.write(self.usb_go, 0)
            program.copy(source + n * 2 * CHUNK, SRAM_PCIE, first)
            if size > CHUNK:
                program.copy(source + n * 2 * CHUNK + CHUNK, SRAM_PCIE + HALF, size - CHUNK)
            program.write(CQ_RELEASE_PCIE, 0)
            program.fence(FENCE_PCIE, n + 1)
        async with self._batch():
            await self.ring.submit(program)
            for n, size in enumerate(sizes):
                first = min(size, CHUNK)
                wire = -(-size // SECTOR) * SECTOR + (SECTOR if size > CHUNK else 0)
                data = await self._receive(wire, n, after if n == 0 else None)
                base = n * 2 * CHUNK
                wire_image = memoryview(data)  # slices of it are views: one copy per part
                target[base : base + first] = wire_image[:first]
                if size > CHUNK:
                    target[base + first : base + size] = wire_image[HALF : HALF + size - CHUNK]
            await self._drained(len(sizes), f"copy-out of {len(target)} bytes")
        self.stats.bytes_out += len(target)
        self.stats.chunks_out += len(sizes)

    async def _receive(self, wire: int, n: int, after: After | None) -> bytes:
        """Arm the SRAM read, let the GPU go, receive the chunk (``after``: the first of a
        copy-out queued behind that dword)."""
        bound = self.bulk_timeout if after is None else after.timeout
        try:
            async with self.bridge.in_pipe.hold(f"copy-out chunk {n}"):
                self._arm_unused = True  # until the read arrives: a read left armed stays armed
                await self.bridge.arm_sram(read=True, slot=0, length=wire)
                await self.bridge.mem_write(self.usb_go, n + 1)
                data = await self.usb.bulk_in(EP_BULK_IN, wire, timeout=bound)
                self._arm_unused = False
                return data
        except BudgetExhausted as exc:
            if after is None:
                raise
            raise BudgetExhausted(  # the wait was for the kernel, or its output behind it
                budget=exc.budget,
                awaited=f"{after.awaited}, then the copy-out behind it",
                timeout=exc.timeout,
                elapsed=exc.elapsed,
                layer=Layer.GPU_QUEUE,
                expected=after.value & 0xFFFF_FFFF,
            ) from exc
        except UsbTransferTimeout as exc:
            if after is not None:
                await self._before_start(after, exc)
            fence = None
            with contextlib.suppress(Exception):
                fence = await self._fence()
            if fence is not None and serial_reached(fence, n + 1, bits=_FENCE_BITS):
                exc.add_note(
                    f"the GPU finished copy-out chunk {n} (fence {fence}) "
                    "but never released the armed read"
                )
                raise
            timeout = SignalTimeout(
                awaited=f"copy engine: copy-out chunk {n} (usb_go {n + 1})",
                timeout=exc.timeout,
                elapsed=exc.elapsed,
                layer=Layer.GPU_QUEUE,
                expected=(n + 1) & 0xFF,
                observed=fence,
            )
            await self._diagnose(timeout)
            raise timeout from exc

    async def _before_start(self, after: After, exc: UsbTransferTimeout) -> None:
        """The first chunk of a copy-out queued behind ``after`` timed out. If the device never
        saw that dword reach its value (or cannot say), the wait was for it: a
        :class:`SignalTimeout` naming it, or a :class:`GpuFault` when the device is in its
        error state (the kernel failed)."""
        observed = error = None
        with contextlib.suppress(Exception):  # unread: the copy-out never had its go either
            observed = await self.bridge.mem_read(after.address)
            error = await self.bridge.mem_read(self.status + hw.STATUS_ERROR)
        if observed is not None and observed >= after.value & 0xFFFF_FFFF:
            return  # it had: the copy-out itself failed (diagnosed by the caller)
        if error:
            raise GpuFault(
                f"the GPU entered its error state (interrupt 0x{error:x}) before {after.awaited}",
                source=error,
                awaited=after.awaited,
            ) from exc
        raise SignalTimeout(
            awaited=after.awaited,
            timeout=exc.timeout,
            elapsed=exc.elapsed,
            layer=Layer.GPU_QUEUE,
            expected=after.value & 0xFFFF_FFFF,
            observed=observed,
        ) from exc

"""The libusb and pyusb backends without a device: library timeouts taken from the bound, library
outcomes mapped onto the typed family, the pyusb backend's threads (against a fake pyusb device),
and libusb's event integration with the loop. Through real libusb and an emulated device:
tests/umockdev/."""

from __future__ import annotations

import asyncio
import errno
import tempfile
import threading
import time
from typing import Any

import anyio
import pytest
import usb.core
import usb1
from hypothesis import given
from hypothesis import strategies as st

from aio_runtime import (
    BudgetExhausted,
    DeviceLost,
    HardwareTimeout,
    Layer,
    Ledger,
    TransferError,
    UsbTransferTimeout,
    WaitBound,
    deadline_scope,
    use_ledger,
    wait_until,
)
from transports.sim.umockdev import (
    EmulatedBridge,
    UmockdevUnavailable,
    descriptors,
    umockdev_available,
)
from transports.usb import ShortTransfer, UsbStall
from transports.usb.base import describe_bulk, describe_control, library_timeout_ms
from transports.usb.libusb_backend import LibusbContext, LibusbTransport, transfer_outcome
from transports.usb.pyusb_backend import PyusbTransport, pyusb_error

pytestmark = pytest.mark.anyio


# -- library timeouts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remaining", "ms"),
    [(0.0, 1), (0.0001, 1), (0.001, 1), (0.0011, 2), (0.1, 100), (1.1, 1100), (10.0, 10_000)],
)
def test_a_library_timeout_is_the_time_left_in_whole_ms_rounded_up_and_never_zero(remaining, ms):
    assert library_timeout_ms(remaining) == ms


@given(st.floats(min_value=0.0, max_value=1e5))
def test_a_library_timeout_never_means_forever_nor_overshoots_a_millisecond(remaining):
    ms = library_timeout_ms(remaining)
    assert ms >= 1
    assert remaining * 1000 - 1e-6 <= ms < remaining * 1000 + 1 + 1e-6 or ms == 1


@pytest.mark.parametrize(
    ("ours", "text"),
    [
        (describe_control(True, 0xE4, 0xA800, 0, 4), "control IN 0xe4 (value 0xa800, 4 bytes)"),
        (describe_control(False, 0xE5, 0xA800, 7, 0), "control OUT 0xe5 (value 0xa800, index 0x7)"),
        (describe_bulk(0x81, 512), "bulk IN ep 0x81 (512 bytes)"),
        (describe_bulk(0x02, 64), "bulk OUT ep 0x02 (64 bytes)"),
    ],
)
def test_every_backend_names_transfers_alike(ours, text):
    assert ours == text


# -- libusb outcomes ---------------------------------------------------------------------------


def bound(timeout: float = 1.0) -> WaitBound:
    return WaitBound(awaited="bulk IN ep 0x81 (8 bytes)", error=UsbTransferTimeout, timeout=timeout)


async def test_a_completed_libusb_transfer_returns_its_data():
    assert transfer_outcome(usb1.TRANSFER_COMPLETED, 2, b"ok", exact=2, is_in=True, bound=bound())
    assert (
        transfer_outcome(usb1.TRANSFER_COMPLETED, 8, b"", exact=8, is_in=False, bound=bound())
        is None
    )


async def test_fewer_bytes_than_required_is_a_short_transfer():
    with pytest.raises(ShortTransfer) as info:
        transfer_outcome(usb1.TRANSFER_COMPLETED, 3, b"abc", exact=8, is_in=True, bound=bound())
    assert (info.value.expected, info.value.actual) == (8, 3)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (usb1.TRANSFER_TIMED_OUT, UsbTransferTimeout),
        (usb1.TRANSFER_STALL, UsbStall),
        (usb1.TRANSFER_NO_DEVICE, DeviceLost),
        (usb1.TRANSFER_ERROR, TransferError),
        (usb1.TRANSFER_CANCELLED, TransferError),
        (usb1.TRANSFER_OVERFLOW, TransferError),
    ],
)
async def test_libusb_statuses_map_onto_the_typed_family(status, error):
    with pytest.raises(error) as info:
        transfer_outcome(status, 0, b"", exact=8, is_in=True, bound=bound())
    assert info.value.layer is Layer.USB_TRANSFER
    assert info.value.awaited == "bulk IN ep 0x81 (8 bytes)"


async def test_libusb_timing_out_a_transfer_cut_by_a_frame_budget_is_budget_exhausted():
    with deadline_scope(0.05, name="frame 9"):
        cut = bound(timeout=10.0)
    with pytest.raises(BudgetExhausted) as info:
        transfer_outcome(usb1.TRANSFER_TIMED_OUT, 0, b"", exact=8, is_in=True, bound=cut)
    assert info.value.budget == "frame 9"


# -- the libusb transport, against a fake handle ----------------------------------------------------


class FakeLibusbTransfer:
    """A libusb transfer the device never completes: it ends only when cancelled, and its callback
    then comes later, from event handling, as libusb's does."""

    def __init__(self, *, finished_before_cancel: bool = False) -> None:
        self.timeout: int | None = None
        self.callback: Any = None
        self.status = -1
        self.finished_before_cancel = finished_before_cancel
        self.cancels = 0

    def setControl(self, rt, req, value, index, data, callback, timeout):
        self.callback, self.timeout = callback, timeout

    def setBulk(self, endpoint, data, callback, timeout):
        self.callback, self.timeout = callback, timeout

    def submit(self) -> None:
        if self.finished_before_cancel:  # it completes, but its callback has not run yet
            self.status = usb1.TRANSFER_COMPLETED
            asyncio.get_running_loop().call_later(0.01, self.callback, self)

    def cancel(self) -> None:
        self.cancels += 1
        if self.finished_before_cancel:
            raise usb1.USBErrorNotFound
        self.status = usb1.TRANSFER_CANCELLED
        asyncio.get_running_loop().call_soon(self.callback, self)

    def getStatus(self) -> int:
        return self.status

    def getActualLength(self) -> int:
        return 0

    def getBuffer(self) -> memoryview:
        return memoryview(b"")

    def doom(self) -> None: ...

    def close(self) -> None: ...


class FakeLibusbHandle:
    def __init__(self, **transfer: bool) -> None:
        self.transfers: list[FakeLibusbTransfer] = []
        self.options = transfer

    def getTransfer(self) -> FakeLibusbTransfer:
        self.transfers.append(FakeLibusbTransfer(**self.options))
        return self.transfers[-1]


class LoopThread:
    def on_loop(self, fn):
        fn()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_libusb_transfer_gets_the_time_left_and_is_cancelled_and_reaped_at_the_bound():
    handle, ledger = FakeLibusbHandle(), Ledger()
    transport = LibusbTransport(LoopThread(), handle)  # type: ignore[arg-type]
    with use_ledger(ledger), deadline_scope(0.05, name="frame 1"):
        with pytest.raises(BudgetExhausted) as info:
            await transport.control_in(0xC0, 0xE4, 0xA800, 0, 4, timeout=10)
        ledger.assert_empty()
    (transfer,) = handle.transfers
    assert 1 <= transfer.timeout <= 50 and transfer.cancels == 1
    assert not info.value.in_flight


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cancelling_a_libusb_transfer_that_just_finished_is_harmless():
    handle = FakeLibusbHandle(finished_before_cancel=True)
    transport = LibusbTransport(LoopThread(), handle)  # type: ignore[arg-type]
    with pytest.raises(UsbTransferTimeout) as info:
        await transport.bulk_out(0x02, b"x" * 8, timeout=0.001)
    assert handle.transfers[0].cancels == 1
    assert not info.value.in_flight  # its callback was awaited all the same
    assert not getattr(info.value, "__notes__", [])  # and the refused cancel is no news


# -- pyusb errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (usb.core.USBTimeoutError("Operation timed out", -7, errno.ETIMEDOUT), UsbTransferTimeout),
        (usb.core.USBError("Pipe error", -9, errno.EPIPE), UsbStall),
        (usb.core.USBError("No such device", -4, errno.ENODEV), DeviceLost),
        (usb.core.USBError("Input/Output Error", -1, errno.EIO), TransferError),
    ],
)
async def test_pyusb_errors_map_onto_the_typed_family(raised, error):
    mapped = pyusb_error(raised, bound())
    assert isinstance(mapped, error)
    assert mapped.layer is Layer.USB_TRANSFER  # type: ignore[attr-defined]


async def test_errors_that_are_not_pyusb_s_pass_unchanged():
    mistake = TypeError("a bug")
    assert pyusb_error(mistake, bound()) is mistake


# -- the pyusb backend's threads -----------------------------------------------------------------


class FakePyusbDevice:
    """pyusb's blocking calls: records each call's timeout (ms); ``delay`` seconds per call,
    ``respect_timeout`` False makes a call outlast its own timeout."""

    def __init__(self, *, delay: float = 0.0, respect_timeout: bool = True) -> None:
        self.delay, self.respect_timeout = delay, respect_timeout
        self.calls: list[tuple[str, object, int]] = []
        self.lock = threading.Lock()
        self.fail: Exception | None = None

    def _block(self, kind: str, what: object, timeout: int) -> None:
        with self.lock:
            self.calls.append((kind, what, timeout))
        if self.fail is not None:
            raise self.fail
        limit = timeout / 1000 if self.respect_timeout else self.delay
        time.sleep(min(self.delay, limit))
        if self.delay > limit:
            raise usb.core.USBTimeoutError("Operation timed out", -7, errno.ETIMEDOUT)

    def ctrl_transfer(self, rt: int, req: int, value: int, index: int, data: Any, timeout: int):
        self._block("control", req, timeout)
        return bytes(data) if isinstance(data, int) else len(data)

    def write(self, endpoint: int, data: Any, timeout: int) -> int:
        self._block("write", bytes(data[:1]), timeout)
        return len(data)

    def read(self, endpoint: int, length: int, timeout: int) -> bytes:
        self._block("read", length, timeout)
        return bytes(length)


async def test_a_pyusb_call_gets_the_time_left_as_its_timeout():
    device = FakePyusbDevice()
    transport = PyusbTransport(device)
    await transport.control_out(0x40, 0xE5, 0xA800, 1, timeout=0.25)
    with deadline_scope(0.05):
        await transport.bulk_in(0x81, 8, timeout=10)
    (_, _, first), (_, _, second) = device.calls
    assert 200 <= first <= 250 and 1 <= second <= 50  # the time left when the call starts


async def test_pyusb_bulk_outs_in_flight_run_in_submission_order():
    device = FakePyusbDevice(delay=0.02)
    transport = PyusbTransport(device)
    first = transport.submit_bulk_out(0x02, b"A" * 8, timeout=1)
    second = transport.submit_bulk_out(0x02, b"B" * 8, timeout=1)
    await second.wait()
    assert first.done()
    assert [what for _, what, _ in device.calls] == [b"A", b"B"]


async def test_a_pyusb_call_ends_by_its_own_timeout_and_is_awaited():
    ledger = Ledger()
    with use_ledger(ledger):
        transport = PyusbTransport(FakePyusbDevice(delay=5.0))
        with pytest.raises(UsbTransferTimeout) as info:
            await transport.bulk_in(0x81, 8, timeout=0.05)
        ledger.assert_empty()
    assert not info.value.in_flight


async def test_a_pyusb_call_that_overruns_its_timeout_keeps_its_buffer_and_says_so():
    ledger = Ledger()
    with use_ledger(ledger):
        device = FakePyusbDevice(delay=0.3, respect_timeout=False)
        transport = PyusbTransport(device, drain_timeout=0.05)
        with pytest.raises(UsbTransferTimeout) as info:
            await transport.bulk_out(0x02, bytearray(8), timeout=0.05)
        assert info.value.in_flight
        assert [entry.kind for entry in ledger.live()] == ["usb transfer"]
        await wait_until(  # the call returns by itself, and gives back its buffer then
            ledger.live, lambda live: not live, awaited="the call", error=HardwareTimeout, timeout=2
        )


async def test_a_pyusb_no_device_leaves_the_transport_dead():
    device = FakePyusbDevice()
    device.fail = usb.core.USBError("No such device", -4, errno.ENODEV)
    transport = PyusbTransport(device)
    with pytest.raises(DeviceLost):
        await transport.control_in(0xC0, 0xE4, 0, 0, 1, timeout=1)
    device.fail = None
    with pytest.raises(DeviceLost, match="open it again"):
        await transport.control_in(0xC0, 0xE4, 0, 0, 1, timeout=1)


async def test_a_pyusb_short_read_is_a_short_transfer():
    class Short(FakePyusbDevice):
        def read(self, endpoint: int, length: int, timeout: int) -> bytes:
            return bytes(length // 2)

    with pytest.raises(ShortTransfer):
        await PyusbTransport(Short()).bulk_in(0x81, 8, timeout=1)


# -- libusb's events on the loop -----------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_libusb_s_own_fds_are_watched_by_the_loop_until_the_context_closes():
    async with LibusbContext() as context:
        assert len(context.watched_fds) >= 2  # libusb's event fd and timer fd
        assert not context.polled_fds
    assert not context.watched_fds


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_fd_epoll_refuses_is_polled_on_a_loop_timer_until_libusb_removes_it():
    with tempfile.TemporaryFile() as regular:  # what umockdev's device node is
        async with LibusbContext() as context:
            context._on_added(regular.fileno(), 0x004, None)  # libusb's notifier: POLLOUT
            assert context.polled_fds == {regular.fileno()}
            await wait_until(
                lambda: context.fallback_polls,
                lambda polls: polls >= 3,
                awaited="fallback polls",
                error=HardwareTimeout,
                timeout=2,
            )
            context._on_removed(regular.fileno(), None)
            polls = context.fallback_polls
            await anyio.sleep(0.02)
            assert context.fallback_polls == polls and not context.polled_fds


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fds_libusb_adds_and_removes_on_another_thread_are_handed_to_the_loop():
    with tempfile.TemporaryFile() as first, tempfile.TemporaryFile() as second:
        async with LibusbContext() as context:

            def add_then_remove() -> None:  # before the loop runs: never watched at all
                context._on_added(first.fileno(), 0x004, None)
                context._on_removed(first.fileno(), None)
                context._on_added(second.fileno(), 0x004, None)

            await anyio.to_thread.run_sync(add_then_remove)
            await wait_until(
                lambda: context.polled_fds,
                lambda fds: fds == {second.fileno()},
                awaited="the loop watches the added fd",
                error=HardwareTimeout,
                timeout=2,
            )
            await anyio.to_thread.run_sync(context._on_removed, second.fileno(), None)
            assert not context.polled_fds  # the removal waited for the loop to let go


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_libusb_backend_says_it_needs_asyncio():
    with pytest.raises(RuntimeError, match="asyncio"):
        async with LibusbContext():
            pass


# -- the emulated device's description -------------------------------------------------------------


@pytest.mark.parametrize(("speed", "packet"), [(True, 1024), (False, 512)])
def test_the_emulated_bridge_has_bulk_out_0x02_and_bulk_in_0x81(speed, packet):
    raw = descriptors(superspeed=speed, vendor=0xADD1, product=0x0001)
    found, offset = [], 0
    while offset < len(raw):
        length, kind = raw[offset], raw[offset + 1]
        if kind == 5:  # endpoint
            found.append((raw[offset + 2], int.from_bytes(raw[offset + 4 : offset + 6], "little")))
        offset += length
    assert offset == len(raw)
    assert found == [(0x02, packet), (0x81, packet)]
    assert int.from_bytes(raw[8:10], "little") == 0xADD1


@pytest.mark.skipif(umockdev_available(), reason="runs where umockdev's preload is absent")
def test_without_umockdev_s_preload_an_emulated_bridge_says_how_to_get_it():
    with pytest.raises(UmockdevUnavailable, match="umockdev-wrapper"):
        EmulatedBridge(server=None, bridge=None).__enter__()  # type: ignore[arg-type]

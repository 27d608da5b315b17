"""Blocking calls on worker threads: bounded, typed, and drained before their buffers are reused.

Real time (threads are involved), short durations.
"""

from __future__ import annotations

import threading

import anyio
import pytest

from aio_runtime import ModelTimeout, UsbTransferTimeout, deadline_scope, run_in_thread
from aio_runtime.errors import BudgetExhausted

pytestmark = pytest.mark.anyio


async def test_the_result_of_the_blocking_call_is_returned():
    assert await run_in_thread(lambda: 6 * 7, awaited="x", error=ModelTimeout, timeout=5.0) == 42


async def test_the_exception_of_the_blocking_call_is_raised_in_the_task():
    def fails() -> None:
        raise OSError("LIBUSB_ERROR_PIPE")

    with pytest.raises(OSError, match="PIPE"):
        await run_in_thread(fails, awaited="x", error=UsbTransferTimeout, timeout=5.0)


async def test_an_overrunning_call_is_asked_to_stop_and_awaited_before_the_timeout_is_raised():
    stop = threading.Event()
    returned = threading.Event()

    def inference() -> str:
        stop.wait(10.0)  # an onnxruntime run that honours run_options.terminate
        returned.set()
        return "terminated"

    with pytest.raises(ModelTimeout) as info:
        await run_in_thread(
            inference, awaited="model run", error=ModelTimeout, timeout=0.05, cancel=stop.set
        )
    assert returned.is_set()  # the call had returned before the error reached us
    assert info.value.in_flight is False
    assert info.value.elapsed >= 0.05


async def test_a_call_that_ignores_the_stop_request_is_reported_in_flight():
    release = threading.Event()
    try:
        with pytest.raises(UsbTransferTimeout) as info:
            await run_in_thread(
                lambda: release.wait(10.0),
                awaited="pyusb read",
                error=UsbTransferTimeout,
                timeout=0.05,
                cancel=lambda: None,
                drain_timeout=0.05,
            )
        assert info.value.in_flight is True
    finally:
        release.set()


async def test_a_frame_budget_bounds_the_call_too():
    stop = threading.Event()
    with deadline_scope(0.05, name="frame 2"):
        with pytest.raises(BudgetExhausted) as info:
            await run_in_thread(
                lambda: stop.wait(10.0),
                awaited="model run",
                error=ModelTimeout,
                timeout=5.0,
                cancel=stop.set,
            )
    assert info.value.budget == "frame 2"


async def test_cancelling_the_task_stops_and_drains_the_call():
    stop = threading.Event()
    returned = threading.Event()

    def call() -> None:
        stop.wait(10.0)
        returned.set()

    with anyio.move_on_after(0.05):
        await run_in_thread(call, awaited="x", error=ModelTimeout, timeout=5.0, cancel=stop.set)
    assert returned.is_set()

"""Tests an application team would write against the installed wheel, with pytest-asyncio and the
``aio_runtime`` pytest plugin's fixtures (``ledger``, ``captured_logs``), under virtual time.

Run by ``make wheel-check`` in a fresh environment holding the wheel with its ``dms`` extra, pytest
and pytest-asyncio, and nothing else; not part of the project's own test suite.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aio_runtime as rt
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms import DmsService, ServiceConfig

FRAMES = 60
HANG_AT = 20


@pytest.mark.asyncio
async def test_a_30_second_gpu_hang_is_a_typed_timeout_at_once_and_is_logged(ledger, captured_logs):
    signal = rt.TimelineSignal(np.zeros(2, dtype=np.uint64), name="gpu")
    vram = rt.RangeAllocator(1 << 20, name="vram")
    loop = asyncio.get_running_loop()
    async with virtual_time():
        scratch = vram.alloc(4096)
        start = loop.time()
        try:
            with rt.log_context(frame_id=7, stage="model"):
                with pytest.raises(rt.SignalTimeout) as info:
                    await signal.wait(1, timeout=30.0)
                rt.get_logger("my_app").warning("step failed", error=str(info.value))
        finally:
            vram.free(scratch)
        assert loop.time() - start == pytest.approx(30.0)
    assert info.value.layer is rt.Layer.GPU_QUEUE
    assert (info.value.expected, info.value.observed) == (1, 0)
    assert [(e["event"], e["frame_id"], e["stage"]) for e in captured_logs] == [
        ("step failed", 7, "model")
    ]


@pytest.mark.asyncio
async def test_the_dms_service_is_unavailable_during_a_gpu_hang_and_available_after_it(ledger):
    config = ServiceConfig(
        device="sim",
        frames=FRAMES,
        faults=f"gpu-hang@{HANG_AT}+6",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
    )
    states: list[rt.Availability] = []
    published: list[bool] = []
    async with virtual_time(autojump_threshold=0.005, hold=threads_busy(ledger)):
        async with asyncio.timeout(30):  # virtual seconds; the run takes FRAMES periods (3 s)
            async with DmsService(config) as service:

                async def messages() -> None:
                    async for message in service.messages(backlog=FRAMES):
                        published.append(message.valid)

                async def transitions() -> None:
                    with service.transitions() as stream:
                        async for transition in stream:
                            states.append(transition.current.availability)

                tasks = [asyncio.create_task(job()) for job in (messages, transitions)]
                summary = await service.finished()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    assert summary.frames.received == FRAMES
    assert rt.Availability.UNAVAILABLE in states
    hung = states.index(rt.Availability.UNAVAILABLE, states.index(rt.Availability.AVAILABLE))
    assert rt.Availability.AVAILABLE in states[hung:]  # recovered
    assert True in published and False in published

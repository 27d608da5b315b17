"""The DMS service on an accelerator reached through real libusb: the simulated GPU (running the
reference model as its kernel) behind the simulated bridge, served as an emulated USB device. The
service's accelerator backend is the same as for the simulator in process; only the transport
differs."""

from __future__ import annotations

import anyio
import pytest

from pipelines.dms.backends.cpu import OnnxRunner
from pipelines.dms.backends.sim import simulated_device
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.model.warp import MODEL_INPUT_SIZE
from pipelines.dms.service import DmsService
from transports.sim.server import SimServer
from transports.sim.umockdev import EmulatedBridge
from transports.usb.libusb_backend import LibusbContext, open_bridge

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

FRAMES = 40
VALID = 10
"""Valid frames asked of the run: the emulated link takes milliseconds a round trip (a frame's
copies take much longer than on the simulator in process), so many frames are dropped, latest
wins, and some are late."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the libusb backend's event integration is asyncio's


async def test_the_service_runs_frames_on_the_accelerator_through_real_libusb():
    kernel = OnnxRunner(reference_model_path())  # what the emulated device's GPU runs

    def device():
        return simulated_device(
            kernel.run_blocking,
            image_size=MODEL_INPUT_SIZE,
            output_size=kernel.contract.output_length,
        )

    config = ServiceConfig(
        device="sim",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
        frames=FRAMES,
        budget=1.0,  # generous: the emulated link is slow
        gpu_hang_after=1.0,
    )
    messages, opened = [], []
    try:
        with SimServer(device) as server, EmulatedBridge(server, server.device.bridge) as usb:
            with anyio.fail_after(90):
                async with LibusbContext() as context:

                    async def transport():
                        opened.append(await open_bridge(context, timeout=5))
                        return opened[-1]

                    source = SyntheticCamera(frames=FRAMES)
                    async with DmsService(config, source=source, transport=transport) as service:

                        async def collect():
                            async for message in service.messages(backlog=FRAMES):
                                messages.append(message)

                        async with anyio.create_task_group() as tg:
                            tg.start_soon(collect)
                            await service.finished()
                            tg.cancel_scope.cancel()
    finally:
        kernel.close()
    frames = service.summary.frames
    frames.check()
    assert frames.received == FRAMES
    valid = [m for m in messages if m.valid]
    assert len(valid) >= VALID, service.summary.frames
    assert all(m.readiness["deviceOnline"] and m.gpu_execution_time > 0 for m in valid)
    # one session, through libusb and the emulated device, for the whole run
    assert len(opened) == 1 and usb.ioctls > 1000
    sessions = [t for _, t in service.summary.transitions if "opening session" in t]
    assert len(sessions) == 1, sessions

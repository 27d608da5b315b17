"""Shared set-up for tests of the simulated GPU, the copy protocol and the device session."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import numpy as np

from transports.gpu import GpuSession, SessionConfig
from transports.sim import FaultPlan, FaultRule
from transports.sim.gpu import SimDevice
from transports.sim.usb import SimUsbTransport

ADD_ONE, SLOW_ADD_ONE, FAILS = 1, 2, 3
SLOW = 1.0
"""Seconds of simulated time the slow kernel takes."""

# Bounds short enough that a fault test takes little virtual time, distinct so that a test can
# tell which one fired.
FAST = SessionConfig(
    control_timeout=0.5,
    request_timeout=1.0,
    link_timeout=1.0,
    firmware_timeout=2.0,
    bulk_timeout=1.5,
    fence_timeout=1.0,
    kernel_timeout=3.0,
    copy_watchdog_ms=5_000,
    mode1_reset_pause=0.5,
)
SLACK = 0.2
"""How far past its bound a failure may be reported (diagnostic reads after the timeout)."""


def add_one(gpu, source, target, size):
    gpu.view(target, size)[:] = gpu.view(source, size) + np.uint8(1)


def fails(gpu, *args):
    raise ValueError("illegal instruction")


def device(*rules: FaultRule, **options) -> SimDevice:
    sim = SimDevice(plan=FaultPlan(rules), **options)
    sim.gpu.register_kernel(ADD_ONE, add_one)
    sim.gpu.register_kernel(SLOW_ADD_ONE, add_one, duration=SLOW)
    sim.gpu.register_kernel(FAILS, fails)
    return sim


@contextlib.asynccontextmanager
async def session(
    *rules: FaultRule, config: SessionConfig = FAST, **options
) -> AsyncIterator[tuple[SimDevice, GpuSession]]:
    async with device(*rules, **options) as sim:
        gpu = await GpuSession.open(SimUsbTransport(sim.bridge), config=config)
        try:
            yield sim, gpu
        finally:
            await gpu.aclose()


async def reopen(sim: SimDevice, config: SessionConfig = FAST) -> GpuSession:
    return await GpuSession.open(SimUsbTransport(sim.bridge), config=config)

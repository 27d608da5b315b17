"""The accelerator's link: one transport in use at a time, handed from the probe to the next
session, and a probe that tells a device that lost one of a session's transfers. In virtual time,
over the in-process simulator."""

from __future__ import annotations

import contextlib
import math

import anyio
import pytest

from aio_runtime import (
    AvailabilityMachine,
    Backoff,
    DeviceLost,
    Ledger,
    Supervisor,
    now,
    use_ledger,
)
from aio_runtime.testing import TransitionRecorder, virtual_time
from pipelines.dms.backends.link import AcceleratorLink
from transports.protocol.bridge import LTSSM_XDATA, VendorRequest
from transports.sim import Fault, FaultPlan, FaultRule
from transports.sim.gpu import SimDevice
from transports.sim.usb import SimUsbTransport
from transports.usb import CONTROL_IN

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROBE = 0.05


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Opener:
    def __init__(self, sim: SimDevice) -> None:
        self.sim = sim
        self.opened: list[SimUsbTransport] = []

    async def __call__(self) -> SimUsbTransport:
        self.opened.append(SimUsbTransport(self.sim.bridge))
        return self.opened[-1]


async def test_the_probe_opens_its_own_transport_and_the_next_session_takes_it_over():
    async with virtual_time(), SimDevice() as sim:
        opener = Opener(sim)
        async with AcceleratorLink(opener, probe_timeout=PROBE) as link:
            assert await link.probe()
            assert await link.probe()
            assert len(opener.opened) == 1  # kept between probes
            lent = await link.take()
            assert lent.usb is opener.opened[0]  # the probe's, handed over
            assert await link.probe()  # over the session's transport now
            assert len(opener.opened) == 1
            link.give_back(lent)
            await lent.aclose()
            assert await link.probe()
            assert len(opener.opened) == 2  # a new one of its own


async def test_a_probe_transport_whose_device_went_away_is_replaced():
    async with virtual_time(), SimDevice() as sim:
        opener = Opener(sim)
        async with AcceleratorLink(opener, probe_timeout=PROBE) as link:
            sim.plan.add(FaultRule(Fault.DISCONNECT, at=1))
            assert not await link.probe()
            assert await link.probe()  # the bridge is back: asked over a fresh transport
            assert len(opener.opened) == 2


async def test_a_control_transfer_the_session_lost_makes_one_probe_say_no():
    ledger = Ledger()
    async with virtual_time(), SimDevice(plan=FaultPlan()) as sim:
        async with AcceleratorLink(Opener(sim), probe_timeout=PROBE) as link:
            with use_ledger(ledger):
                lent = await link.take()
                sim.plan.add(FaultRule(Fault.USB_TIMEOUT, at=1))  # the next transfer only
                async with anyio.create_task_group() as tg:

                    async def lost() -> None:  # a session's read the bridge never answers
                        with pytest.raises(TimeoutError):
                            await lent.control_in(
                                CONTROL_IN, VendorRequest.READ_XDATA, LTSSM_XDATA, 0, 1, timeout=1.0
                            )

                    tg.start_soon(lost)
                    await anyio.sleep(0.01)
                    start = now()
                    assert await link.probe()  # it has not been gone long enough yet
                    await anyio.sleep(link.lost_after)
                    assert not await link.probe()  # answered at once; the session's one not
                    assert await link.probe()  # told once: the device answers
                    assert now() - start < 0.2
                link.give_back(lent)
                await lent.aclose()
    ledger.assert_empty()


async def test_a_probe_under_a_usb_timeout_says_no_within_its_bound():
    async with virtual_time(), SimDevice() as sim:
        async with AcceleratorLink(Opener(sim), probe_timeout=PROBE) as link:
            sim.plan.add(FaultRule(Fault.USB_TIMEOUT, at=1, count=math.inf))
            start = now()
            assert not await link.probe()
            assert now() - start == pytest.approx(PROBE, abs=1e-3)
            sim.plan.clear()
            assert await link.probe()


async def test_while_a_session_opens_its_transport_the_probe_opens_no_second_one():
    async with virtual_time(), SimDevice() as sim:
        opener = Opener(sim)

        async def slow_opener() -> SimUsbTransport:
            await anyio.sleep(0.5)  # a real device takes a while to open and claim
            return await opener()

        async with AcceleratorLink(slow_opener, probe_timeout=PROBE) as link:
            async with anyio.create_task_group() as tg:
                taken = []

                async def take() -> None:
                    taken.append(await link.take())

                tg.start_soon(take)
                await anyio.sleep(0.1)
                assert await link.probe() is None  # no news: the opening is the probe
                assert opener.opened == []
            assert await link.probe()  # over the session's, now it has one
            assert len(opener.opened) == 1
            link.give_back(taken[0])
            await taken[0].aclose()


async def test_a_transport_that_cannot_be_opened_yet_is_no_answer_of_a_device_that_is_back():
    """The device is away for its first second; opening a transport to it takes 30 ms, then
    finds none (30 ms: under the probe's bound; at a tie, which one ended first would be
    decided by the rounding of the clock's floats). The supervisor's probes while an attempt
    opens its transport hear nothing from the device: no attempt is abandoned as though it
    answered, each attempt opens one transport, and the session opens on the first probe that
    finds the device back."""
    machine = AvailabilityMachine()
    async with virtual_time(), SimDevice() as sim:
        opener = Opener(sim)
        openings: list[float] = []
        t0 = now()

        async def enumerating() -> SimUsbTransport:
            openings.append(now() - t0)
            await anyio.sleep(0.03)
            if now() - t0 < 1.0:
                raise DeviceLost("bridge not enumerated")
            return await opener()

        async with AcceleratorLink(enumerating, probe_timeout=PROBE) as link:
            opened: list[float] = []

            @contextlib.asynccontextmanager
            async def session():
                lent = await link.take()
                try:
                    opened.append(now() - t0)
                    yield lent
                finally:
                    link.give_back(lent)
                    await lent.aclose()

            async def run(lent) -> None:  # the session's work is done once it is open
                pass

            supervisor = Supervisor(
                "accelerator",
                session,
                run,
                availability=machine,
                backoff=Backoff(initial=0.1, cap=0.2),
                probe=link.probe,
            )
            with TransitionRecorder(machine) as recorder, anyio.fail_after(5):
                await supervisor.run()
    stats = supervisor.statistics()
    assert stats.abandoned == 0
    assert not any("abandoned" in state.reason for state in recorder.states() if state.reason)
    assert stats.attempts == stats.failures + 1  # each attempt failed opening, but the last
    assert len(openings) == stats.failures + stats.probes_failed + 1  # the last probe's opened
    assert 1.0 <= opened[0] < 1.0 + 0.1 + 0.05

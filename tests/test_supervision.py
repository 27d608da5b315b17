from __future__ import annotations

import contextlib
import itertools
import random

import anyio
import pytest

from aio_runtime import (
    Availability,
    AvailabilityMachine,
    Backoff,
    DeviceLost,
    Supervisor,
    now,
)
from aio_runtime.testing import TransitionRecorder, virtual_time

pytestmark = pytest.mark.anyio


def test_backoff_doubles_up_to_the_cap_and_stays_there():
    backoff = Backoff(initial=0.1, factor=2, cap=1.0)
    assert [backoff.delay(n) for n in range(1, 8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    )
    assert backoff.delay(10_000) == 1.0


def test_backoff_jitter_stays_within_its_fraction_and_the_cap():
    backoff = Backoff(initial=1.0, factor=2, cap=4.0, jitter=0.25)
    rng = random.Random(7)
    delays = [backoff.delay(2, rng) for _ in range(200)]
    assert min(delays) >= 1.5
    assert max(delays) <= 2.5
    assert len(set(delays)) > 100
    assert all(backoff.delay(10, rng) <= 4.0 for _ in range(100))


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"cap": 0.01}, {"factor": 0.5}, {"jitter": 1.0}, {"initial": float("nan")}],
)
def test_backoff_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)


class FlakyDevice:
    """Fails to open ``failures`` times, then opens; the session's run then does ``run``."""

    def __init__(self, failures: int, run_for: float = 0.0, fault: Exception | None = None):
        self.failures = failures
        self.run_for = run_for
        self.fault = fault
        self.open_times: list[float] = []
        self.teardowns = 0

    @contextlib.asynccontextmanager
    async def open(self):
        self.open_times.append(now())
        if len(self.open_times) <= self.failures:
            raise DeviceLost("bridge not enumerated")
        try:
            yield self
        finally:
            self.teardowns += 1

    async def run(self, session):
        await anyio.sleep(self.run_for)
        if self.fault is not None:
            raise self.fault


def gaps(times):
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


async def test_supervisor_reopens_with_exponential_backoff_then_finishes():
    device = FlakyDevice(failures=4)
    supervisor = Supervisor(
        "gpu", device.open, device.run, backoff=Backoff(initial=0.1, factor=2, cap=10)
    )
    async with virtual_time():
        await supervisor.run()
    assert gaps(device.open_times) == pytest.approx([0.1, 0.2, 0.4, 0.8])
    stats = supervisor.statistics()
    assert (stats.attempts, stats.failures) == (5, 4)
    assert "DeviceLost" in stats.last_error


async def test_supervisor_keeps_trying_at_the_cap_for_as_long_as_it_runs():
    device = FlakyDevice(failures=10**9)
    supervisor = Supervisor(
        "gpu", device.open, device.run, backoff=Backoff(initial=0.5, factor=2, cap=2.0)
    )
    async with virtual_time():
        with anyio.move_on_after(60):
            await supervisor.run()
    assert gaps(device.open_times)[:3] == pytest.approx([0.5, 1.0, 2.0])
    assert set(gaps(device.open_times)[2:]) == {2.0}
    assert len(device.open_times) >= 29
    assert supervisor.statistics().consecutive_failures == len(device.open_times)


async def test_each_attempt_and_failure_reaches_the_availability_machine():
    machine = AvailabilityMachine(recover_after=1)
    device = FlakyDevice(failures=2)
    supervisor = Supervisor(
        "gpu", device.open, device.run, availability=machine, backoff=Backoff(initial=0.1, cap=1)
    )
    with TransitionRecorder(machine) as recorder:
        async with virtual_time():
            await supervisor.run()
    reasons = [s.reason for s in recorder.states()[1:]]
    assert reasons == [
        "gpu: opening session (attempt 1)",
        "gpu: DeviceLost: [host] bridge not enumerated (attempt 1 failed; retrying in 0.1 s)",
        "gpu: opening session (attempt 2; last error: DeviceLost: [host] bridge not enumerated)",
        "gpu: DeviceLost: [host] bridge not enumerated (attempt 2 failed; retrying in 0.2 s)",
        "gpu: opening session (attempt 3; last error: DeviceLost: [host] bridge not enumerated)",
    ]
    assert all(s.availability is Availability.UNAVAILABLE for s in recorder.states())


async def test_a_fault_while_running_tears_the_session_down_before_reopening():
    device = FlakyDevice(failures=0, run_for=1.0, fault=DeviceLost("unplugged"))
    supervisor = Supervisor("gpu", device.open, device.run, backoff=Backoff(initial=0.1, cap=1))
    async with virtual_time():
        with anyio.move_on_after(3.5):
            await supervisor.run()
    assert device.teardowns == len(device.open_times)
    assert supervisor.statistics().failures >= 2


async def test_cancelling_the_supervisor_tears_down_the_open_session():
    device = FlakyDevice(failures=0, run_for=100.0)
    supervisor = Supervisor("gpu", device.open, device.run)
    async with virtual_time():
        with anyio.move_on_after(1.0):
            await supervisor.run()
    assert device.teardowns == 1


async def test_a_session_that_stayed_healthy_resets_the_backoff():
    device = FlakyDevice(failures=0, run_for=5.0, fault=DeviceLost("glitch"))
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=0.1, factor=2, cap=10),
        healthy_after=4.0,
    )
    async with virtual_time():
        with anyio.move_on_after(20):
            await supervisor.run()
    # every session ran 5 s (>= healthy_after) before failing: each retry waits the initial delay
    assert set(gaps(device.open_times)) == {5.1}
    assert supervisor.statistics().consecutive_failures == 1


async def test_a_session_that_fails_quickly_keeps_backing_off():
    device = FlakyDevice(failures=0, run_for=0.5, fault=DeviceLost("glitch"))
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=0.1, factor=2, cap=10),
        healthy_after=4.0,
    )
    async with virtual_time():
        with anyio.move_on_after(5):
            await supervisor.run()
    assert gaps(device.open_times)[:3] == pytest.approx([0.6, 0.7, 0.9])


class SlowTeardownDevice:
    def __init__(self, teardown_takes: float):
        self.teardown_takes = teardown_takes
        self.log: list[str] = []

    @contextlib.asynccontextmanager
    async def open(self):
        try:
            yield self
        finally:
            self.log.append("teardown start")
            await anyio.sleep(self.teardown_takes)  # reset queues, free memory, ...
            self.log.append("teardown done")

    async def run(self, session):
        await anyio.sleep(100.0)


async def test_cancelling_supervision_lets_an_awaiting_teardown_finish():
    device = SlowTeardownDevice(teardown_takes=0.2)
    supervisor = Supervisor("gpu", device.open, device.run)
    async with virtual_time():
        with anyio.move_on_after(1.0):
            await supervisor.run()
    assert device.log == ["teardown start", "teardown done"]


async def test_a_teardown_that_overruns_is_cut_and_counted_as_a_failure():
    device = SlowTeardownDevice(teardown_takes=100.0)

    async def fail(session):
        raise DeviceLost("gone")

    supervisor = Supervisor(
        "gpu", device.open, fail, teardown_timeout=0.5, backoff=Backoff(initial=1.0, cap=1.0)
    )
    async with virtual_time():
        with anyio.move_on_after(1.2):
            await supervisor.run()
    assert "teardown did not finish within 0.5 s" in supervisor.statistics().last_error


async def test_a_fatal_error_ends_supervision_after_reporting_it():
    machine = AvailabilityMachine()

    @contextlib.asynccontextmanager
    async def open_session():
        yield None

    async def run(session):
        raise TypeError("bug in the session code")

    supervisor = Supervisor("gpu", open_session, run, availability=machine, fatal=(TypeError,))
    with pytest.raises(TypeError):
        await supervisor.run()
    assert (
        machine.state.reason
        == "gpu: TypeError: bug in the session code (attempt 1 failed; not retried)"
    )


async def test_each_failure_is_logged_with_its_traceback(captured_logs):
    device = FlakyDevice(failures=1)
    supervisor = Supervisor("gpu", device.open, device.run, backoff=Backoff(initial=0.1, cap=1))
    async with virtual_time():
        await supervisor.run()
    failures = [e for e in captured_logs if e["event"] == "session failed"]
    assert len(failures) == 1
    assert isinstance(failures[0]["exc_info"], DeviceLost)


async def test_cancelling_supervision_during_an_overrunning_teardown_stops_it():
    device = SlowTeardownDevice(teardown_takes=100.0)
    machine = AvailabilityMachine()
    supervisor = Supervisor(
        "gpu", device.open, device.run, availability=machine, teardown_timeout=0.2
    )
    async with virtual_time():
        with anyio.move_on_after(1.0):
            await supervisor.run()
    assert supervisor.statistics().failures == 0  # a cancellation is not a fault to retry
    assert "retrying" not in machine.state.reason

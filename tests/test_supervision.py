from __future__ import annotations

import contextlib
import io
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


async def test_a_typed_fault_is_logged_as_one_line_with_its_traceback_at_debug(captured_logs):
    device = FlakyDevice(failures=1)
    supervisor = Supervisor("gpu", device.open, device.run, backoff=Backoff(initial=0.1, cap=1))
    async with virtual_time():
        await supervisor.run()
    failures = [e for e in captured_logs if e["event"] == "session failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "warning"
    assert failures[0]["error"] == "DeviceLost: [host] bridge not enumerated"
    assert "exc_info" not in failures[0]
    tracebacks = [e for e in captured_logs if "exc_info" in e]
    assert len(tracebacks) == 1
    assert tracebacks[0]["log_level"] == "debug"
    assert isinstance(tracebacks[0]["exc_info"], DeviceLost)


async def test_an_unexpected_error_is_logged_with_its_traceback(captured_logs):
    calls = []

    @contextlib.asynccontextmanager
    async def open_session():
        calls.append(now())
        if len(calls) == 1:
            raise KeyError("a bug in the session code")
        yield None

    async def run(session):
        pass

    supervisor = Supervisor("gpu", open_session, run, backoff=Backoff(initial=0.1, cap=1))
    async with virtual_time():
        await supervisor.run()
    failures = [e for e in captured_logs if e["event"] == "session failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "warning"
    assert isinstance(failures[0]["exc_info"], KeyError)


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


def test_a_typed_fault_renders_as_one_line_at_warning():
    """What an operator's log shows for an expected restart: one line, no traceback."""
    from aio_runtime import configure_logging

    stream = io.StringIO()
    configure_logging("console", stream=stream, level="warning")  # undone after the test
    device = FlakyDevice(failures=1)
    supervisor = Supervisor("gpu", device.open, device.run, backoff=Backoff(initial=0.1, cap=1))

    async def main():
        async with virtual_time():
            await supervisor.run()

    anyio.run(main)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "session failed" in lines[0] and "bridge not enumerated" in lines[0]
    assert "Traceback" not in stream.getvalue()


# -- probing: reopening as soon as the device answers again ----------------------------------------


class ProbedDevice:
    """A device that is away during ``away`` = (start, end) seconds after :meth:`start` (or
    during each of a list of them). Opening
    it while it is away waits out ``open_bound`` (the hardware bounds of an open) and fails; a
    session that opens runs ``run_for`` and fails with ``fault`` (None: it finishes). Times are
    recorded from :meth:`start`."""

    def __init__(self, away, *, open_bound=10.0, run_for=0.0, fault=None, open_fails=0, takes=0.0):
        self.away = away
        self.takes = takes
        """Seconds a probe, and an open, take before they find the device there or not."""
        self.open_bound = open_bound
        self.run_for = run_for
        self.fault = fault
        self.open_fails = open_fails
        self.open_times: list[float] = []
        self.opened_times: list[float] = []
        self.cleanups = 0
        self.probe_times: list[float] = []
        self.probe_while_running = 0
        self._running = False
        self.t0 = 0.0

    def start(self):
        self.t0 = now()

    def now(self):
        return now() - self.t0

    def present(self):
        windows = self.away if isinstance(self.away, list) else [self.away]
        return not any(start <= self.now() < end for start, end in windows)

    async def probe(self):
        self.probe_times.append(self.now())
        await anyio.sleep(self.takes)
        if self._running:
            self.probe_while_running += 1
        return self.present()

    @contextlib.asynccontextmanager
    async def open(self):
        self.open_times.append(self.now())
        try:
            await anyio.sleep(self.takes)
            if not self.present():
                await anyio.sleep(self.open_bound)
                raise DeviceLost("no answer within the open's bounds")
            if len(self.open_times) <= self.open_fails:
                raise DeviceLost("firmware refused")
        except BaseException:
            self.cleanups += 1
            raise
        self.opened_times.append(self.now())
        yield self

    async def run(self, session):
        self._running = True
        try:
            await anyio.sleep(self.run_for)
        finally:
            self._running = False
        if self.fault is not None:
            raise self.fault


async def test_backing_off_ends_when_the_device_answers_again():
    # Opened at 0, fails at 1 (the device goes away); backing off 5 s at the cap; back at 2.25.
    device = ProbedDevice((1.0, 2.25), run_for=1.0, fault=DeviceLost("unplugged"))
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=5.0, cap=5.0),
        probe=device.probe,
        probe_interval=0.1,
        healthy_after=100,
    )
    async with virtual_time():
        device.start()
        with anyio.move_on_after(2.5):
            await supervisor.run()
    # The first probe that answers (at 2.3, the 13th every 0.1 s from 1.0) ends the backoff.
    assert device.open_times == pytest.approx([0.0, 2.3])
    assert device.probe_while_running == 0
    stats = supervisor.statistics()
    assert stats.probes == 13 and stats.probes_failed == 12


async def test_a_device_that_answers_but_fails_to_open_waits_out_its_backoff():
    device = ProbedDevice((-1, -1), open_fails=3)
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=0.5, factor=2, cap=10),
        probe=device.probe,
        probe_interval=0.1,
    )
    async with virtual_time():
        await supervisor.run()
    assert gaps(device.open_times) == pytest.approx([0.5, 1.0, 2.0])


async def test_a_session_that_failed_running_is_reopened_one_probe_after_the_device_answers():
    # Each session fails 0.2 s after opening, on a device that answers: the backoff grows
    # (0.1, 0.2, 0.4, ...), but each reopen comes at the first probe, 0.1 s after the failure.
    device = ProbedDevice((-1, -1), run_for=0.2, fault=DeviceLost("hung"))
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=0.1, factor=2, cap=5),
        probe=device.probe,
        probe_interval=0.1,
        healthy_after=1.0,
    )
    async with virtual_time():
        with anyio.move_on_after(2.05):
            await supervisor.run()
    assert set(gaps(device.open_times)) == {0.3}
    assert supervisor.statistics().consecutive_failures >= 6  # the backoff grew meanwhile


async def test_an_opening_attempt_begun_while_the_device_was_away_is_abandoned_when_it_answers():
    # The device is away from the start until 0.35: the first open waits out its 10 s bound
    # in vain unless abandoned; the probes at 0.1..0.3 fail, the one at 0.4 answers.
    machine = AvailabilityMachine()
    device = ProbedDevice((0.0, 0.35), open_bound=10.0)
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        availability=machine,
        backoff=Backoff(initial=0.1, cap=5),
        probe=device.probe,
        probe_interval=0.1,
    )
    with TransitionRecorder(machine) as recorder:
        async with virtual_time():
            device.start()
            with anyio.fail_after(5):
                await supervisor.run()
    assert device.open_times == pytest.approx([0.0, 0.4])
    assert device.opened_times == pytest.approx([0.4])
    assert device.cleanups == 1  # the abandoned attempt's context manager cleaned up
    stats = supervisor.statistics()
    assert (stats.attempts, stats.failures, stats.abandoned) == (2, 0, 1)
    assert "gpu: opening session (attempt 2; attempt 1 abandoned: the device answers again)" in [
        s.reason for s in recorder.states()
    ]


async def test_an_attempt_begun_after_failed_probes_is_abandoned_at_the_first_answer():
    # Away from 1.0 to 1.65; the session fails at 1.0 (as it goes); the backoff (0.5 s) runs out
    # at 1.5 while the probes still fail, so attempt 2 begins while the device is away: its
    # first probe (1.6) fails too, the next (1.7) answers and abandons it at once.
    device = ProbedDevice((1.0, 1.65), run_for=1.0, fault=DeviceLost("unplugged"))
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=0.5, cap=5),
        probe=device.probe,
        probe_interval=0.1,
        healthy_after=100,
    )
    async with virtual_time():
        device.start()
        with anyio.move_on_after(1.8):
            await supervisor.run()
    assert device.open_times == pytest.approx([0.0, 1.5, 1.7])
    assert device.opened_times == pytest.approx([0.0, 1.7])
    assert supervisor.statistics().abandoned == 1


async def test_an_attempt_is_not_abandoned_while_the_device_keeps_answering():
    device = ProbedDevice((-1, -1))

    @contextlib.asynccontextmanager
    async def slow_open():
        await anyio.sleep(2.0)  # a long boot, on a device that answers throughout
        async with device.open() as session:
            yield session

    supervisor = Supervisor("gpu", slow_open, device.run, probe=device.probe, probe_interval=0.1)
    async with virtual_time():
        device.start()
        await supervisor.run()
    assert device.opened_times == pytest.approx([2.0])
    assert supervisor.statistics().abandoned == 0
    # every 0.1 s while it opened
    assert gaps(device.probe_times) == pytest.approx([0.1] * (len(device.probe_times) - 1))
    assert len(device.probe_times) >= 19 and device.probe_times[-1] <= 2.0 + 1e-6


async def test_a_probe_with_no_news_is_neither_an_answer_nor_a_failure():
    # A long open on a device that answers throughout, whose probe has no news for its first
    # second (what it looks over is being opened): no probe failed, so the answers that follow
    # abandon nothing.
    device = ProbedDevice((-1, -1))

    async def probe():
        return None if device.now() < 0.95 else await device.probe()

    @contextlib.asynccontextmanager
    async def slow_open():
        # Open between two probes: a probe the open's end cuts short is not counted, and one due
        # at that very instant would run first or not by a rounding error of the clock.
        await anyio.sleep(2.05)
        async with device.open() as session:
            yield session

    supervisor = Supervisor("gpu", slow_open, device.run, probe=probe, probe_interval=0.1)
    async with virtual_time():
        device.start()
        with anyio.fail_after(5):
            await supervisor.run()
    assert device.opened_times == pytest.approx([2.05])
    stats = supervisor.statistics()
    assert (stats.attempts, stats.abandoned, stats.probes_failed) == (1, 0, 0)
    assert stats.probes - len(device.probe_times) == 10 and len(device.probe_times) >= 10


@pytest.mark.parametrize("behaviour", ["raises", "overruns"])
async def test_a_probe_that_raises_or_overruns_did_not_answer(behaviour):
    probed: list[float] = []

    async def probe():
        probed.append(now())
        if behaviour == "raises":
            raise DeviceLost("no device")
        await anyio.sleep(10)
        return True

    device = FlakyDevice(failures=1)
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=1.0, cap=1.0),
        probe=probe,
        probe_interval=0.1,
        probe_timeout=0.05,
    )
    async with virtual_time():
        with anyio.fail_after(5):
            await supervisor.run()
    assert gaps(device.open_times) == pytest.approx([1.0])  # no answer: the backoff runs out
    stats = supervisor.statistics()
    assert stats.probes == stats.probes_failed >= 9
    assert len(probed) - stats.probes in (0, 1)  # the last one may be cut short by the open


@pytest.mark.parametrize("kwargs", [{"probe_interval": 0}, {"probe_timeout": -1.0}])
def test_probe_bounds_must_be_positive(kwargs):
    async def probe():
        return True

    with pytest.raises(ValueError):
        Supervisor("gpu", FlakyDevice(0).open, FlakyDevice(0).run, probe=probe, **kwargs)


async def test_an_open_that_fails_fast_on_an_absent_device_is_retried_when_it_answers():
    # The device is away for the first 0.05 s: the first open fails at once, before any probe
    # could see it gone. Probed at once as the backoff (5 s) begins, it is found absent, and
    # the first probe that answers, 0.1 s on, ends the backoff.
    device = ProbedDevice((0.0, 0.05), open_bound=0.0)
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=5.0, cap=5.0),
        probe=device.probe,
        probe_interval=0.1,
        probe_timeout=0.01,
    )
    async with virtual_time():
        device.start()
        with anyio.fail_after(1):
            await supervisor.run()
    assert device.open_times == pytest.approx([0.0, 0.1])
    assert device.probe_times[0] == pytest.approx(0.0)


async def test_a_brief_absence_as_an_attempt_begins_is_seen_by_a_probe_made_at_once():
    # (Probes and opens take 1 ms to find the device there or not.) The first attempt is
    # abandoned by the probe at 0.4; the second begins at 0.401, as the device goes away again
    # for under a probe period: its open would wait out its 10 s, but a probe made as it began
    # saw the device gone, so the next probe's answer abandons it.
    device = ProbedDevice([(0.0, 0.35), (0.4015, 0.45)], open_bound=10.0, takes=0.001)
    supervisor = Supervisor(
        "gpu",
        device.open,
        device.run,
        backoff=Backoff(initial=0.1, cap=5),
        probe=device.probe,
        probe_interval=0.1,
    )
    async with virtual_time():
        device.start()
        with anyio.fail_after(5):
            await supervisor.run()
    assert device.open_times == pytest.approx([0.0, 0.401, 0.502], abs=1e-6)
    assert device.opened_times == pytest.approx([0.503], abs=1e-6)
    assert supervisor.statistics().abandoned == 2

"""The wait primitive: bounds, typed failures, probes, policies — under virtual time."""

from __future__ import annotations

import anyio
import pytest
from timeout_kinds import TIMEOUT_KINDS

from aio_runtime import (
    BudgetExhausted,
    Completion,
    FirmwareTimeout,
    Layer,
    PollPolicy,
    SignalTimeout,
    UnboundedWaitError,
    UsbTransferTimeout,
    WaitBound,
    deadline_scope,
    drain,
    now,
    wait_complete,
    wait_until,
)
from aio_runtime.testing import ScriptedProbe, virtual_time

pytestmark = pytest.mark.anyio

EPS = 1e-9  # float rounding of virtual clock arithmetic

SLACK = 1e-6  # virtual time: a timeout fires exactly at its deadline


@pytest.mark.parametrize(("kind", "layer"), TIMEOUT_KINDS)
async def test_probe_wait_times_out_with_its_kind_layer_values_and_elapsed(kind, layer):
    probe = ScriptedProbe.never(initial=3)
    async with virtual_time():
        start = now()
        with pytest.raises(kind) as info:
            await wait_until(
                probe, lambda v: v >= 5, awaited="word >= 5", error=kind, timeout=30.0, expected=5
            )
        assert now() - start == pytest.approx(30.0)
    exc = info.value
    assert exc.layer is layer
    assert (exc.expected, exc.observed, exc.timeout) == (5, 3, 30.0)
    assert 30.0 - EPS <= exc.elapsed <= 30.0 + SLACK
    assert exc.awaited == "word >= 5"


@pytest.mark.parametrize(("kind", "layer"), TIMEOUT_KINDS)
async def test_completion_wait_times_out_with_its_kind_and_layer(kind, layer):
    async with virtual_time():
        with pytest.raises(kind) as info:
            await wait_complete(Completion(), awaited="callback", error=kind, timeout=10.0)
    assert info.value.layer is layer
    assert 10.0 - EPS <= info.value.elapsed <= 10.0 + SLACK


async def test_completion_set_by_a_callback_later_is_returned():
    completion: Completion[str] = Completion()
    async with virtual_time(), anyio.create_task_group() as tg:

        async def complete_later():
            await anyio.sleep(2.0)
            completion.set_result("done")

        tg.start_soon(complete_later)
        start = now()
        result = await wait_complete(completion, awaited="x", error=UsbTransferTimeout, timeout=5)
        assert result == "done"
        assert now() - start == pytest.approx(2.0)


async def test_completion_exception_is_reraised_unchanged():
    completion: Completion[int] = Completion()
    original = KeyError("boom")
    completion.set_exception(original)
    with pytest.raises(KeyError) as info:
        await wait_complete(completion, awaited="x", error=UsbTransferTimeout, timeout=1)
    assert info.value is original


async def test_completion_cannot_complete_twice():
    completion: Completion[int] = Completion()
    completion.set_result(1)
    with pytest.raises(RuntimeError, match="already set"):
        completion.set_result(2)
    with pytest.raises(RuntimeError):
        Completion().result()


async def test_anyio_event_is_a_waitable():
    event = anyio.Event()
    event.set()
    assert await wait_complete(event, awaited="e", error=SignalTimeout, timeout=1) is None


async def test_wait_without_any_bound_is_refused_even_under_a_foreign_cancel_scope():
    with anyio.fail_after(1):
        with pytest.raises(UnboundedWaitError, match="without a bound"):
            await wait_until(lambda: 0, bool, awaited="x", error=SignalTimeout)
        with pytest.raises(UnboundedWaitError):
            await wait_complete(Completion(), awaited="x", error=SignalTimeout)


async def test_negative_or_nan_timeout_is_a_value_error():
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError):
            await wait_until(lambda: 0, bool, awaited="x", error=SignalTimeout, timeout=bad)


async def test_enclosing_scope_cuts_a_longer_wait_and_reports_budget_exhaustion():
    async with virtual_time():
        with deadline_scope(0.05, name="frame 12") as scope:
            with pytest.raises(BudgetExhausted) as info:
                await wait_until(
                    ScriptedProbe.never(),
                    bool,
                    awaited="fence",
                    error=SignalTimeout,
                    timeout=10.0,
                    expected=1,
                )
        assert now() == pytest.approx(scope.at)
    exc = info.value
    assert exc.budget == "frame 12"
    assert exc.layer is Layer.GPU_QUEUE  # the layer of the wait that was pending
    assert exc.timeout == pytest.approx(0.05)
    assert exc.elapsed == pytest.approx(0.05)
    assert exc.awaited == "fence"


async def test_wait_own_shorter_timeout_raises_hardware_timeout_inside_a_scope():
    async with virtual_time():
        with deadline_scope(5.0, name="frame"):
            with pytest.raises(SignalTimeout):
                await wait_until(
                    ScriptedProbe.never(), bool, awaited="x", error=SignalTimeout, timeout=1.0
                )


async def test_scope_alone_bounds_a_wait_without_timeout():
    async with virtual_time():
        with deadline_scope(2.0, name="frame"):
            with pytest.raises(BudgetExhausted):
                await wait_complete(Completion(), awaited="x", error=SignalTimeout)


async def test_late_value_is_returned_when_it_arrives():
    probe = ScriptedProbe.late(7, after=1.5)
    async with virtual_time():
        start = now()
        value = await wait_until(
            probe, lambda v: v == 7, awaited="x", error=SignalTimeout, timeout=5.0
        )
        elapsed = now() - start
    assert value == 7
    assert 1.5 - EPS <= elapsed <= 1.5 + PollPolicy().max_interval


async def test_value_arriving_exactly_at_the_deadline_counts():
    probe = ScriptedProbe.late(1, after=2.0)
    async with virtual_time():
        assert await wait_until(probe, bool, awaited="x", error=SignalTimeout, timeout=2.0) == 1


@pytest.mark.parametrize("anyio_backend", ["trio"], indirect=True)  # a clock that starts at zero
async def test_value_arriving_exactly_at_the_deadline_counts_from_any_start():
    # From a start where the seconds since it, subtracted back at the deadline, fall a rounding
    # error short of the timeout: a quarter of the readings of a clock near zero.
    async with virtual_time() as clock:
        for _ in range(1000):
            if (now() + 2.0) - now() < 2.0:
                break
            clock.jump(0.000_7)
        else:
            pytest.fail("no such start in the clock's first 0.7 s")
        probe = ScriptedProbe.late(1, after=2.0)
        assert await wait_until(probe, bool, awaited="x", error=SignalTimeout, timeout=2.0) == 1


async def test_satisfied_condition_returns_without_waiting_even_with_zero_timeout():
    async with virtual_time():
        start = now()
        assert await wait_until(lambda: 4, bool, awaited="x", error=SignalTimeout, timeout=0) == 4
        assert now() == start


async def test_async_probe_is_awaited_each_read():
    probe = ScriptedProbe.late(1, after=0.1, latency=0.01)
    async with virtual_time():
        value = await wait_until(
            probe.read, bool, awaited="register", error=FirmwareTimeout, timeout=1.0
        )
    assert value == 1
    assert probe.reads >= 2


async def test_async_probe_that_never_returns_is_bounded():
    async def hung_read() -> int:
        await anyio.Event().wait()
        return 0

    async with virtual_time():
        with pytest.raises(UsbTransferTimeout) as info:
            await wait_until(
                hung_read, bool, awaited="register over USB", error=UsbTransferTimeout, timeout=3.0
            )
    assert info.value.elapsed == pytest.approx(3.0)
    assert "never read" in str(info.value.observed)


async def test_probe_exception_propagates():
    def broken() -> int:
        raise OSError("bus error")

    with pytest.raises(OSError, match="bus error"):
        await wait_until(broken, bool, awaited="x", error=SignalTimeout, timeout=1.0)


async def test_reset_on_progress_restarts_the_timer_while_the_value_moves():
    async with virtual_time():
        moving = ScriptedProbe.partial([1, 2, 3], every=0.8)
        start = now()
        with pytest.raises(SignalTimeout) as info:
            await wait_until(
                moving,
                lambda v: v >= 4,
                awaited="x",
                error=SignalTimeout,
                timeout=1.0,
                reset_on_progress=True,
                expected=4,
            )
        inactive_elapsed = now() - start
        absolute = ScriptedProbe.partial([1, 2, 3], every=0.8)
        with pytest.raises(SignalTimeout) as absolute_info:
            await wait_until(
                absolute,
                lambda v: v >= 4,
                awaited="x",
                error=SignalTimeout,
                timeout=1.0,
                expected=4,
            )
    assert info.value.observed == 3
    assert 3.4 - PollPolicy().max_interval <= inactive_elapsed <= 3.4 + PollPolicy().max_interval
    assert absolute_info.value.observed == 1


async def test_reset_on_progress_never_moves_the_enclosing_scope():
    async with virtual_time():
        moving = ScriptedProbe.partial(range(1, 100), every=0.5)
        with deadline_scope(2.0, name="frame") as scope:
            with pytest.raises(BudgetExhausted):
                await wait_until(
                    moving,
                    lambda v: v >= 1000,
                    awaited="x",
                    error=SignalTimeout,
                    timeout=1.0,
                    reset_on_progress=True,
                )
        assert now() == pytest.approx(scope.at)


async def test_polling_backs_off_instead_of_spinning():
    probe = ScriptedProbe.never()
    policy = PollPolicy(spin=4, first_interval=0.001, max_interval=0.1)
    async with virtual_time():
        with pytest.raises(SignalTimeout):
            await wait_until(
                probe, bool, awaited="x", error=SignalTimeout, timeout=10.0, policy=policy
            )
    # 4 spins + ~7 growing intervals to reach 0.1 s + ~100 reads at the cap + final read
    assert 100 <= probe.reads <= 120


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio may run the two in either order
@pytest.mark.parametrize(("yield_first", "reads"), [(False, 2), (True, 1)])
async def test_yield_first_lets_the_producer_run_before_the_first_read(yield_first, reads):
    """A read that costs a transfer is not spent on a condition the next loop pass meets."""
    state = {"value": 0, "reads": 0}

    def probe() -> int:
        state["reads"] += 1
        return state["value"]

    async def producer() -> None:
        state["value"] = 1

    policy = PollPolicy(yield_first=yield_first)
    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)  # runs at the waiter's first yield
        await wait_until(probe, bool, awaited="x", error=SignalTimeout, timeout=1.0, policy=policy)
    assert state["reads"] == reads


@pytest.mark.parametrize("holds", [True, False])
async def test_yield_first_still_reads_once_with_no_time_left(holds):
    """A bound already reached during the first yield: the (async) probe is read once, as without
    the yield — a condition that holds returns, one that does not is a typed timeout."""
    reads = []

    async def probe() -> bool:
        reads.append(now())
        return holds

    policy = PollPolicy(yield_first=True)
    async with virtual_time():
        with deadline_scope(0.0, name="frame"):
            if holds:
                assert await wait_until(
                    probe, bool, awaited="x", error=SignalTimeout, timeout=1.0, policy=policy
                )
            else:
                with pytest.raises(BudgetExhausted):
                    await wait_until(
                        probe, bool, awaited="x", error=SignalTimeout, timeout=1.0, policy=policy
                    )
    assert len(reads) == 1


def test_poll_policy_intervals_spin_then_grow_to_the_cap():
    policy = PollPolicy(spin=2, first_interval=0.001, max_interval=0.004, factor=2)
    intervals = policy.intervals()
    assert [next(intervals) for _ in range(6)] == [0.0, 0.0, 0.001, 0.002, 0.004, 0.004]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"spin": -1},
        {"first_interval": 0},
        {"max_interval": float("inf")},
        {"first_interval": 0.01, "max_interval": 0.001},
        {"factor": 0.5},
    ],
)
def test_poll_policy_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        PollPolicy(**kwargs)


async def test_a_done_completion_returns_even_with_no_time_left():
    completion: Completion[int] = Completion()
    completion.set_result(5)
    assert await wait_complete(completion, awaited="x", error=SignalTimeout, timeout=0) == 5
    async with virtual_time():
        with deadline_scope(0.01, name="spent"):
            await anyio.sleep(0.02)
            assert await wait_complete(completion, awaited="x", error=SignalTimeout) == 5


class CancellableOperation:
    """An in-flight operation (a USB transfer, an inference run) that stops some time after
    being asked to, or never."""

    def __init__(self, stops_after: float | None):
        self.completion: Completion[str] = Completion()
        self.stops_after = stops_after
        self.cancel_requested_at: float | None = None
        self.task_group = None

    def cancel(self) -> None:
        self.cancel_requested_at = now()
        if self.stops_after is not None:
            self.task_group.start_soon(self._stop)

    async def _stop(self) -> None:
        await anyio.sleep(self.stops_after)
        self.completion.set_result("cancelled")


async def test_timeout_cancels_the_operation_and_awaits_its_completion():
    op = CancellableOperation(stops_after=0.05)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        start = now()
        with pytest.raises(UsbTransferTimeout) as info:
            await wait_complete(
                op.completion,
                awaited="bulk IN",
                error=UsbTransferTimeout,
                timeout=1.0,
                cancel=op.cancel,
            )
        assert op.cancel_requested_at == pytest.approx(start + 1.0)
        assert now() == pytest.approx(start + 1.05)  # returned only once the operation stopped
    assert op.completion.done()
    assert info.value.in_flight is False


async def test_an_operation_that_ignores_cancel_is_reported_in_flight():
    op = CancellableOperation(stops_after=None)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        start = now()
        with pytest.raises(UsbTransferTimeout) as info:
            await wait_complete(
                op.completion,
                awaited="bulk IN",
                error=UsbTransferTimeout,
                timeout=1.0,
                cancel=op.cancel,
                drain_timeout=0.5,
            )
        assert now() == pytest.approx(start + 1.5)
    assert info.value.in_flight is True
    assert any("still belong to it" in note for note in info.value.__notes__)


async def test_a_cancelled_waiter_drains_the_operation_before_unwinding():
    op = CancellableOperation(stops_after=0.2)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        start = now()
        with anyio.move_on_after(0.5):
            await wait_complete(
                op.completion,
                awaited="bulk IN",
                error=UsbTransferTimeout,
                timeout=10.0,
                cancel=op.cancel,
            )
        assert now() == pytest.approx(start + 0.7)
    assert op.completion.done()


async def test_a_bounded_sequence_shares_one_deadline_and_reports_the_step_in_progress():
    step_one: Completion[None] = Completion()
    async with virtual_time(), anyio.create_task_group() as tg:

        async def finish_step_one():
            await anyio.sleep(0.4)
            step_one.set_result(None)

        tg.start_soon(finish_step_one)
        with pytest.raises(FirmwareTimeout) as info:
            bound = WaitBound(awaited="PSP ring submit", error=FirmwareTimeout, timeout=1.0)
            await wait_complete(step_one, awaited="ring write", within=bound)
            await wait_until(
                ScriptedProbe.never(initial=7),
                lambda v: v == 9,
                awaited="ring fence == 9",
                within=bound,
                expected=9,
            )
    exc = info.value
    assert (exc.timeout, exc.elapsed) == (1.0, pytest.approx(1.0))
    assert exc.awaited == "ring fence == 9"
    assert (exc.expected, exc.observed) == (9, 7)


async def test_a_step_that_is_not_a_wait_runs_under_the_bound_too():
    async with virtual_time():
        bound = WaitBound(awaited="SMU message 0x6", error=FirmwareTimeout, timeout=0.3)

        async def write() -> str:
            await anyio.sleep(0.1)
            return "written"

        assert await bound.run(write(), awaited="write") == "written"
        with pytest.raises(FirmwareTimeout) as info:
            await bound.run(anyio.Event().wait(), awaited="register write")  # never completes
    assert info.value.elapsed == pytest.approx(0.3)
    assert info.value.awaited == "register write"


async def test_within_excludes_timeout_and_error_is_required_without_it():
    bound = WaitBound(awaited="x", error=SignalTimeout, timeout=1.0)
    with pytest.raises(TypeError, match="either"):
        await wait_until(lambda: 1, bool, awaited="x", within=bound, timeout=1.0)
    with pytest.raises(TypeError, match="error="):
        await wait_until(lambda: 1, bool, awaited="x", timeout=1.0)
    with pytest.raises(TypeError, match="reset_on_progress"):
        await wait_until(lambda: 1, bool, awaited="x", within=bound, reset_on_progress=True)


@pytest.mark.parametrize("misspelled", [{"timout": 1.0}, {"eror": SignalTimeout}])
async def test_a_misspelled_bound_keyword_is_refused(misspelled):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        await wait_complete(Completion(), awaited="x", timeout=1.0, **misspelled)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        await wait_until(lambda: 0, bool, awaited="x", timeout=1.0, **misspelled)


async def test_a_sequence_stuck_after_a_finished_step_does_not_blame_that_step():
    async with virtual_time():
        bound = WaitBound(awaited="SMU message 0x6", error=FirmwareTimeout, timeout=1.0)
        await wait_until(lambda: 1, bool, awaited="earlier answer", within=bound, expected=1)
        with pytest.raises(FirmwareTimeout) as info:
            await wait_complete(Completion(), awaited="SMU response", within=bound)
    assert info.value.awaited == "SMU response"
    assert info.value.observed is None
    assert info.value.elapsed == pytest.approx(1.0)


async def test_a_within_wait_keeps_the_final_read_and_the_drain():
    probe = ScriptedProbe.late(1, after=0.5)
    op = CancellableOperation(stops_after=None)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        bound = WaitBound(awaited="sequence", error=UsbTransferTimeout, timeout=0.5)
        assert await wait_until(probe, bool, awaited="value at the deadline", within=bound) == 1
        with pytest.raises(UsbTransferTimeout) as info:
            await wait_complete(
                op.completion, awaited="transfer", within=bound, cancel=op.cancel, drain_timeout=0.1
            )
    assert info.value.in_flight is True


async def test_a_completion_landing_as_the_deadline_falls_is_returned():
    class LandsWithTheDeadline(Completion[str]):
        """Its callback runs in the same loop pass as the deadline, just before the waiter."""

        async def wait(self) -> str:
            try:
                return await super().wait()
            except anyio.get_cancelled_exc_class():
                self.set_result("data")
                raise

    async with virtual_time():
        result = await wait_complete(
            LandsWithTheDeadline(),
            awaited="bulk IN",
            error=UsbTransferTimeout,
            timeout=1.0,
            cancel=lambda: None,
        )
    assert result == "data"


async def test_a_failing_cancel_does_not_replace_the_timeout():
    def cancel_fails() -> None:
        raise OSError("LIBUSB_ERROR_NOT_FOUND")

    async with virtual_time():
        with pytest.raises(UsbTransferTimeout) as info:
            await wait_complete(
                Completion(),
                awaited="bulk IN",
                error=UsbTransferTimeout,
                timeout=0.1,
                cancel=cancel_fails,
                drain_timeout=0.1,
            )
    assert any("NOT_FOUND" in note for note in info.value.__notes__)
    assert info.value.in_flight is True


async def test_a_cancelled_waiter_whose_operation_will_not_stop_says_so():
    op = CancellableOperation(stops_after=None)
    cancelled = anyio.get_cancelled_exc_class()
    notes = []
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        with anyio.move_on_after(0.2):
            try:
                await wait_complete(
                    op.completion,
                    awaited="bulk IN",
                    error=UsbTransferTimeout,
                    timeout=5.0,
                    cancel=op.cancel,
                    drain_timeout=0.1,
                )
            except cancelled as exc:
                notes = list(getattr(exc, "__notes__", []))
                raise
    assert any("did not stop" in note for note in notes)


async def test_numpy_probes_work_with_inactivity_timeouts():
    import numpy as np

    words = np.zeros(2, dtype=np.uint32)
    async with virtual_time():
        with pytest.raises(SignalTimeout) as info:
            await wait_until(
                lambda: words.copy(),
                lambda v: bool(v.all()),
                awaited="both",
                error=SignalTimeout,
                timeout=0.5,
                reset_on_progress=True,
            )
    assert list(info.value.observed) == [0, 0]


async def test_drain_asks_the_operation_to_stop_and_returns_once_it_has_stopped():
    op = CancellableOperation(stops_after=0.05)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        start = now()
        assert await drain(op.completion, op.cancel, limit=1.0) is True
        assert op.cancel_requested_at == pytest.approx(start)
        assert now() == pytest.approx(start + 0.05)


async def test_drain_of_a_completed_operation_does_not_ask_it_to_stop():
    completion: Completion[str] = Completion()
    completion.set_result("data")
    asked = []
    assert await drain(completion, lambda: asked.append(True), limit=0.0) is True
    assert asked == []


async def test_drain_gives_up_after_its_limit_when_the_operation_will_not_stop():
    op = CancellableOperation(stops_after=None)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        start = now()
        assert await drain(op.completion, op.cancel, limit=0.5) is False
        assert now() == pytest.approx(start + 0.5)


async def test_drain_is_shielded_from_the_cancellation_of_its_caller():
    op = CancellableOperation(stops_after=0.3)
    async with virtual_time(), anyio.create_task_group() as tg:
        op.task_group = tg
        start = now()
        with anyio.CancelScope() as scope:
            scope.cancel()
            assert await drain(op.completion, op.cancel, limit=1.0) is True
        assert now() == pytest.approx(start + 0.3)
    assert op.completion.done()


async def test_drain_drops_what_the_stopped_operation_delivers():
    completion: Completion[str] = Completion()
    assert await drain(
        completion,
        lambda: completion.set_exception(OSError("LIBUSB_TRANSFER_CANCELLED")),
        limit=1.0,
    )


async def test_a_failing_stop_request_is_noted_on_the_failure_given_and_otherwise_ignored():
    def cancel_fails() -> None:
        raise OSError("LIBUSB_ERROR_NOT_FOUND")

    failure = UsbTransferTimeout(awaited="bulk IN", timeout=0.1, elapsed=0.1)
    async with virtual_time():
        assert await drain(Completion(), cancel_fails, limit=0.1) is False
        assert await drain(Completion(), cancel_fails, limit=0.1, failure=failure) is False
    assert [note for note in failure.__notes__ if "NOT_FOUND" in note] == [
        "asking the operation to stop failed: OSError('LIBUSB_ERROR_NOT_FOUND')"
    ]


@pytest.mark.parametrize("limit", [-1.0, float("nan"), float("inf")])
async def test_drain_needs_a_finite_limit(limit):
    with pytest.raises(ValueError, match="limit"):
        await drain(Completion(), lambda: None, limit=limit)


async def test_a_bad_bound_keyword_is_refused_under_the_name_of_the_wait_called():
    with pytest.raises(TypeError, match=r"^wait_complete\(\) got an unexpected keyword argument"):
        await wait_complete(Completion(), awaited="x", timout=1.0)
    with pytest.raises(TypeError, match=r"^wait_until\(\) missing 1 required keyword-only"):
        await wait_until(lambda: 0, bool, timeout=1.0)

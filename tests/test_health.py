from __future__ import annotations

import pickle

import anyio
import pytest

from aio_runtime import (
    Availability,
    AvailabilityMachine,
    Readiness,
    ReadinessLayer,
    Reason,
    reason_kind,
)
from aio_runtime.testing import TransitionRecorder

A, D, U = Availability.AVAILABLE, Availability.DEGRADED, Availability.UNAVAILABLE


def test_machine_starts_unavailable_with_a_reason():
    machine = AvailabilityMachine(initial_reason="device not opened")
    assert machine.state.availability is U
    assert machine.state.reason == "device not opened"


def test_return_to_available_needs_n_good_results_in_a_row():
    machine = AvailabilityMachine(recover_after=3)
    machine.report_good()
    machine.report_good()
    assert machine.state.availability is U
    machine.report_good()
    assert machine.state.availability is A
    assert machine.state.reason is None


def test_a_fault_applies_at_once_and_resets_the_streak():
    machine = AvailabilityMachine(recover_after=2)
    machine.report_good()
    machine.report_good()
    machine.report_unavailable("signal timeout")
    assert str(machine.state) == "unavailable(signal timeout)"
    machine.report_good()
    assert machine.state.availability is U
    machine.report_good()
    assert machine.state.availability is A


def test_degraded_result_interrupts_the_streak():
    machine = AvailabilityMachine(recover_after=3)
    machine.report_good()
    machine.report_good()
    machine.report_degraded("stale calibration")
    assert machine.state.availability is D
    machine.report_good()
    machine.report_good()
    assert machine.state.availability is D
    machine.report_good()
    assert machine.state.availability is A


def test_only_changes_are_transitions_and_a_new_reason_is_a_change():
    machine = AvailabilityMachine(recover_after=1)
    with TransitionRecorder(machine) as recorder:
        machine.report_unavailable("starting")  # same state and reason: nothing new
        machine.report_unavailable("camera stalled")
        machine.report_unavailable("camera stalled")
        machine.report_good()
        machine.report_good()
        machine.report_degraded("budget overrun")
    assert [str(s) for s in recorder.states()] == [
        "unavailable(starting)",
        "unavailable(camera stalled)",
        "available",
        "degraded(budget overrun)",
    ]
    seqs = [t.seq for t in recorder.transitions]
    assert seqs == sorted(seqs)
    assert recorder.transitions[0].previous is None
    assert recorder.transitions[1].previous.reason == "starting"


def test_recover_after_must_be_positive():
    with pytest.raises(ValueError):
        AvailabilityMachine(recover_after=0)


@pytest.mark.anyio
async def test_every_subscriber_receives_every_transition_in_order():
    machine = AvailabilityMachine(recover_after=1)
    received: dict[int, list[str]] = {0: [], 1: []}

    async def consume(key: int, ready: anyio.Event):
        with machine.subscribe() as stream:
            ready.set()
            async for transition in stream:
                received[key].append(str(transition.current))
                if len(received[key]) == 4:
                    return

    async with anyio.create_task_group() as tg:
        for key in received:
            ready = anyio.Event()
            tg.start_soon(consume, key, ready)
            await ready.wait()
        machine.report_good()
        machine.report_unavailable("usb timeout")
        machine.report_good()
    expected = ["unavailable(starting)", "available", "unavailable(usb timeout)", "available"]
    assert received == {0: expected, 1: expected}


@pytest.mark.anyio
async def test_recorder_waits_for_a_state():
    machine = AvailabilityMachine(recover_after=1)
    with TransitionRecorder(machine) as recorder:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: recorder.wait_for(A, timeout=5))
            await anyio.lowlevel.checkpoint()
            machine.report_good()
    assert recorder.availabilities() == [U, A]


def test_readiness_layers_start_down_and_come_up_in_order():
    readiness = Readiness()
    assert not any(readiness.snapshot().values())
    with pytest.raises(ValueError, match="device_online is down"):
        readiness.mark_up(ReadinessLayer.FIRMWARE_READY)
    for layer in ReadinessLayer:
        readiness.mark_up(layer)
    assert all(readiness.snapshot().values())


def test_a_lower_layer_going_down_takes_the_layers_above_with_it():
    readiness = Readiness()
    for layer in ReadinessLayer:
        readiness.mark_up(layer)
    readiness.mark_down(ReadinessLayer.QUEUE_SUBMITTABLE, "compute ring hung")
    assert readiness.snapshot() == {
        "device_online": True,
        "firmware_ready": True,
        "queue_submittable": False,
        "task_complete": False,
        "output_valid": False,
    }
    assert readiness.reason(ReadinessLayer.QUEUE_SUBMITTABLE) == "compute ring hung"
    assert (
        readiness.reason(ReadinessLayer.OUTPUT_VALID) == "queue_submittable down: compute ring hung"
    )


def test_output_invalid_does_not_touch_lower_layers():
    readiness = Readiness()
    for layer in ReadinessLayer:
        readiness.mark_up(layer)
    readiness.mark_down(ReadinessLayer.OUTPUT_VALID, "NaN in output")
    assert readiness.is_up(ReadinessLayer.TASK_COMPLETE)
    assert not readiness.is_up(ReadinessLayer.OUTPUT_VALID)


def test_leaving_unavailable_for_degraded_also_needs_n_results_in_a_row():
    machine = AvailabilityMachine(recover_after=3)
    machine.report_unavailable("usb timeout")
    for _ in range(5):  # a device alternating between failing and producing stays unavailable
        machine.report_degraded("stale calibration")
        machine.report_unavailable("usb timeout")
    assert str(machine.state) == "unavailable(usb timeout)"
    machine.report_degraded("stale calibration")
    machine.report_good()
    assert machine.state.availability is U
    machine.report_good()
    assert str(machine.state) == "degraded(stale calibration)"
    machine.report_good()
    assert machine.state.availability is A


def test_a_subscriber_that_falls_too_far_behind_is_disconnected_not_buffered_forever():
    machine = AvailabilityMachine(recover_after=1, max_backlog=4)
    with machine.subscribe() as stream:
        for i in range(10):
            machine.report_unavailable(f"fault {i}")
        received = []
        with pytest.raises(anyio.EndOfStream):
            while True:
                received.append(stream.receive_nowait())
    assert len(received) == 5  # its first state and 4 transitions, in order; then its stream ended
    assert received[0].previous is None
    assert [t.seq for t in received] == sorted(t.seq for t in received)


def test_a_reason_is_its_kind_and_detail_and_reads_as_text():
    reason = Reason("gpu-queue", "compute timeline >= 5: timed out after 0.1 s")
    assert reason == "gpu-queue: compute timeline >= 5: timed out after 0.1 s"
    assert (reason.kind, reason.detail) == (
        "gpu-queue",
        "compute timeline >= 5: timed out after 0.1 s",
    )
    assert Reason("starting") == "starting" and Reason("starting").detail == ""
    assert Reason.of(reason) is reason
    parsed = Reason.of("camera: no frame for 0.25 s")  # text, as a consumer reads it
    assert (parsed.kind, parsed.detail) == ("camera", "no frame for 0.25 s")
    assert reason_kind("invalid output: NaN in face_descs_lhd") == "invalid output"
    assert reason_kind("calibration missing or stale") == "calibration missing or stale"
    copy = pickle.loads(pickle.dumps(reason))
    assert (copy, copy.kind, copy.detail) == (reason, reason.kind, reason.detail)
    assert AvailabilityMachine(initial_reason="").state.reason == ""


def test_availability_is_its_text():
    assert Availability.DEGRADED == "degraded" and f"{Availability.UNAVAILABLE}" == "unavailable"


def test_failures_in_a_row_without_a_result_escalate_to_unavailable():
    machine = AvailabilityMachine(recover_after=1, escalate_after=3)
    machine.report_good()
    assert machine.report_failed("invalid output: NaN") == "invalid output: NaN"
    assert machine.report_failed("invalid output: NaN") == "invalid output: NaN"
    assert machine.state.availability is D and machine.failed_streak == 2
    escalated = machine.report_failed(Reason("invalid output", "NaN"))
    assert machine.state.availability is U
    assert escalated == "no result: 3 in a row; invalid output: NaN"
    assert machine.state.reason == escalated and escalated.kind == "no result"
    machine.report_good()  # a result ends the streak
    assert machine.state.availability is A and machine.failed_streak == 0
    machine.report_failed("late")
    assert machine.state.availability is D


def test_a_produced_result_ends_a_run_of_failures_and_news_of_the_state_does_not_count():
    machine = AvailabilityMachine(recover_after=1, escalate_after=2)
    machine.report_failed("late")
    machine.report_degraded("calibration stale")  # produced: the run starts again
    machine.report_failed("late")
    assert machine.state.availability is D and machine.failed_streak == 1
    machine.report_unavailable("camera: stalled")  # not a result: neither counts nor breaks
    assert machine.failed_streak == 1
    assert machine.report_failed("late") == "no result: 2 in a row; late"
    machine.report_good()
    machine.report_unavailable("camera: stalled")
    machine.report_unavailable("camera: stalled")
    assert machine.report_failed("late") == "late"


def test_escalated_reasons_can_be_worded_by_the_owner():
    machine = AvailabilityMachine(
        escalate_after=1,
        escalated=lambda n, r: Reason("no valid output", f"{n} frames in a row; {r}"),
    )
    assert machine.report_failed("late") == "no valid output: 1 frames in a row; late"
    with pytest.raises(ValueError, match="escalate_after"):
        AvailabilityMachine(escalate_after=0)


def test_per_kind_keeps_one_wording_while_a_cause_of_that_kind_lasts():
    machine = AvailabilityMachine(recover_after=1, per_kind=True)
    with TransitionRecorder(machine) as recorder:
        machine.report_good()
        for elapsed in (0.1, 0.2, 0.3):
            machine.report_unavailable(Reason("gpu-queue", f"timed out after {elapsed} s"))
        machine.report_unavailable(Reason("camera", "stalled"))  # another kind: a transition
        machine.report_unavailable(Reason("camera", "stalled again"), per_kind=False)
        machine.report_good()
        machine.report_degraded(Reason("frame budget", "10 ms late"))
        machine.report_failed(Reason("frame budget", "12 ms late"))
    assert [str(s) for s in recorder.states()] == [
        "unavailable(starting)",
        "available",
        "unavailable(gpu-queue: timed out after 0.1 s)",
        "unavailable(camera: stalled)",
        "unavailable(camera: stalled again)",
        "available",
        "degraded(frame budget: 10 ms late)",
    ]

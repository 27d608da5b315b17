"""The DMS availability policy on its own: a frame's result in, a report and a verdict out — no
service, no clock."""

from __future__ import annotations

import pytest

from aio_runtime import (
    Availability,
    BudgetExhausted,
    CameraTimeout,
    HardwareTimeout,
    Layer,
    Reason,
    SignalTimeout,
)
from aio_runtime.testing import TransitionRecorder
from pipelines.dms.service._policy import FramePolicy

A, D, U = Availability.AVAILABLE, Availability.DEGRADED, Availability.UNAVAILABLE


def policy(**settings) -> FramePolicy:
    return FramePolicy(
        **{"budget": 0.05, "gpu_hang_after": 0.1, "recover_after": 2, "unavailable_after": 3}
        | settings
    )


def over_budget(frame: int = 7) -> BudgetExhausted:
    return BudgetExhausted(
        budget=f"frame {frame}",
        awaited="compute timeline >= 8",
        timeout=0.05,
        elapsed=0.05,
        layer=Layer.GPU_QUEUE,
    )


def good(judge: FramePolicy, frames: int) -> None:
    for _ in range(frames):
        judge.decoded(late=-0.01, calibration=None)


def test_good_frames_are_valid_once_enough_of_them_came_in_a_row():
    judge = policy()
    first = judge.decoded(late=-0.01, calibration=None)
    assert first.reason is not None and first.reason.kind == "recovering"
    assert first.reason == "recovering: unavailable (starting)"
    assert judge.decoded(late=-0.01, calibration=None).reason is None
    assert judge.availability.state.availability is A


def test_a_late_frame_from_a_device_still_making_progress_is_degraded_not_a_restart():
    judge = policy()
    good(judge, 2)
    verdict = judge.over_budget(over_budget(), stalled=0.03)
    assert verdict.reason is not None and verdict.reason.kind == "frame budget"
    assert verdict.fault is None and verdict.timeouts == ("frame-budget",)
    assert judge.availability.state.availability is D
    assert judge.over_budget(over_budget(), stalled=None).fault is None  # no hang detection


def test_a_device_without_progress_for_the_hang_bound_is_unavailable_and_restarted():
    judge = policy()
    good(judge, 2)
    cause = over_budget()
    verdict = judge.over_budget(cause, stalled=0.1)
    assert verdict.timeouts == ("frame-budget", "gpu-queue")
    # the session fails with a hardware timeout of the layer: what was awaited, for how long
    hung = verdict.fault
    assert isinstance(hung, HardwareTimeout) and hung.__cause__ is cause
    assert (hung.layer, hung.awaited, hung.timeout, hung.elapsed) == (
        Layer.GPU_QUEUE,
        "compute timeline >= 8",
        0.1,
        0.1,
    )
    assert verdict.reason is not None and verdict.reason.kind == "gpu-queue"
    assert "no progress for 0.100 s (hung after 0.1 s;" in verdict.reason
    assert judge.availability.state.availability is U


def test_a_hardware_fault_is_unavailable_at_once_under_its_layer():
    judge = policy()
    good(judge, 2)
    fault = SignalTimeout(awaited="compute timeline >= 9", timeout=0.1, elapsed=0.1)
    verdict = judge.device_fault(fault)
    assert verdict.fault is fault and verdict.timeouts == ("gpu-queue",)
    assert (verdict.reason.kind, verdict.reason.detail) == ("gpu-queue", fault.message)
    assert str(judge.availability.state).startswith("unavailable(gpu-queue: ")


def test_isolated_failures_degrade_and_a_run_of_them_is_one_outage():
    judge = policy(unavailable_after=3)
    good(judge, 2)
    with TransitionRecorder(judge.availability) as recorder:
        reasons = [judge.invalid_output("NaN in face_descs_lhd").reason for _ in range(6)]
    assert [r.kind for r in reasons] == ["invalid output"] * 2 + ["no valid output"] * 4
    assert reasons[2] == "no valid output: 3 frames in a row; invalid output: NaN in face_descs_lhd"
    assert reasons[5].startswith("no valid output: 6 frames in a row; ")
    # one transition per cause: degraded once, unavailable once, however many frames
    assert recorder.availabilities() == [A, D, U]


def test_a_frame_that_finds_no_model_says_why_and_reports_nothing():
    judge = policy()
    good(judge, 2)
    verdict = judge.no_model("the accelerator is restarting")
    assert verdict.reason == "model unavailable: the accelerator is restarting"
    assert verdict.fault is None and judge.availability.state.availability is A


@pytest.mark.parametrize(
    ("calibration", "late", "kind"),
    [
        ("calibration missing or stale", -0.01, "calibration missing or stale"),
        (None, 0.004, "frame budget"),
    ],
    ids=["stale-calibration", "decoded-late"],
)
def test_a_decoded_frame_with_stale_calibration_or_decoded_late_is_degraded(
    calibration, late, kind
):
    judge = policy()
    good(judge, 2)
    verdict = judge.decoded(
        late=late, calibration=None if calibration is None else Reason(calibration)
    )
    assert verdict.reason is not None and verdict.reason.kind == kind
    assert judge.availability.state.availability is D


def test_a_stalled_camera_is_unavailable_and_its_failure_keeps_its_own_words():
    judge = policy()
    good(judge, 2)
    stall = CameraTimeout(awaited="a camera frame", timeout=0.25, elapsed=0.25)
    verdict = judge.camera_stalled(stall)
    assert verdict.timeouts == ("camera",) and verdict.reason.kind == "camera"
    judge.camera_stalled(stall)  # the next period: the same cause, the same wording
    judge.camera_failed("ReplayFormatError: truncated")  # news of its own
    assert judge.availability.state.reason == "camera: ReplayFormatError: truncated"


def test_news_of_an_outage_is_not_a_frame_without_output():
    """The outage's reports (a stalled camera each period, the accelerator's supervisor) do not
    count toward ``unavailable_after``: only frames that each failed on their own do."""
    judge = policy(unavailable_after=3)
    good(judge, 2)
    stall = CameraTimeout(awaited="a camera frame", timeout=0.25, elapsed=0.25)
    for _ in range(5):
        judge.camera_stalled(stall)
    judge.availability.report_unavailable(Reason("accelerator", "opening session (attempt 2)"))
    good(judge, 2)
    assert judge.invalid_output("NaN").reason == "invalid output: NaN"
    assert judge.availability.state.availability is D


def test_a_frame_published_late_with_its_output_is_degraded_and_not_a_frame_without_output():
    """However many frames in a row are late, each had an output: DEGRADED, never the outage
    that ``unavailable_after`` frames without one make — and they break a run of failures."""
    judge = policy(unavailable_after=3)
    good(judge, 2)
    judge.invalid_output("NaN")
    judge.invalid_output("NaN")  # two failures in a row: one more would be an outage
    with TransitionRecorder(judge.availability) as recorder:
        verdicts = [judge.decoded(late=0.03, calibration=None) for _ in range(12)]
    assert all(v.reason.kind == "frame budget" and v.fault is None for v in verdicts)
    assert verdicts[0].reason == "frame budget: late: decoded 30.0 ms after the frame's deadline"
    # one transition, to the new cause, however many late frames: never UNAVAILABLE
    assert [str(state.reason.kind) for state in recorder.states()] == [
        "invalid output",
        "frame budget",
    ]
    assert recorder.availabilities() == [D, D]
    assert judge.availability.failed_streak == 0
    judge.invalid_output("NaN")
    judge.invalid_output("NaN")
    assert judge.availability.state.availability is D  # the late frames broke the run


def test_a_model_run_may_go_on_past_its_deadline_for_long_enough_to_judge_a_hang():
    assert policy(budget=0.05, gpu_hang_after=0.1).grace == 0.1
    assert policy(budget=0.2, gpu_hang_after=0.1).grace == 0.2  # never shorter than a budget


def test_frames_without_output_within_the_grace_are_isolated_failures_then_an_outage():
    judge = policy(unavailable_after=3)
    good(judge, 2)
    verdicts = [judge.over_budget(over_budget(frame), stalled=0.02) for frame in range(3)]
    assert [v.fault for v in verdicts] == [None] * 3
    assert [v.reason.kind for v in verdicts] == ["frame budget", "frame budget", "no valid output"]
    assert judge.availability.state.availability is U


def test_evidence_that_reaches_the_hang_bound_within_the_clocks_rounding_is_a_hang():
    judge = policy(gpu_hang_after=0.1)
    good(judge, 2)
    assert judge.over_budget(over_budget(), stalled=0.05 + 0.05 - 1e-12).fault is not None
    judge = policy(gpu_hang_after=0.1)
    good(judge, 2)
    assert judge.over_budget(over_budget(), stalled=0.0999).fault is None

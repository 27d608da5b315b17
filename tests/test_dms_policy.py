"""The DMS policy on its own, row by row of the decision table in docs/service.md: a frame's result
in, a verdict and a report to the availability out — no service, no clock (times are given)."""

from __future__ import annotations

import re

import pytest

from aio_runtime import (
    Availability,
    BudgetExhausted,
    CameraTimeout,
    Layer,
    Reason,
    SignalTimeout,
)
from aio_runtime.testing import TransitionRecorder
from pipelines.dms.service._host import HostSample
from pipelines.dms.service._policy import FramePolicy
from pipelines.dms.service._rate import RATE_WINDOW

A, D, U = Availability.AVAILABLE, Availability.DEGRADED, Availability.UNAVAILABLE
PERIOD = 0.05


def policy(**settings) -> FramePolicy:
    return FramePolicy(
        **{"budget": 0.05, "stale_after": 0.1, "recover_after": 2, "unavailable_after": 3}
        | settings
    )


def bound_ran_out(frame: int = 7) -> BudgetExhausted:
    return BudgetExhausted(
        budget=f"frame {frame}",
        awaited="the model's run",
        timeout=0.1,
        elapsed=0.1,
        layer=Layer.MODEL,
    )


def on_time(judge: FramePolicy, at: float = 0.0, calibration: Reason | None = None):
    """A valid output published 30 ms after its start of frame (``at``)."""
    return judge.decoded(
        at=at + 0.03, deadline=at + 0.05, stale_at=at + 0.1, calibration=calibration
    )


def good(judge: FramePolicy, frames: int) -> None:
    for _ in range(frames):
        on_time(judge)


def test_an_on_time_frame_is_valid_whatever_the_availability_whose_recovery_is_its_own():
    judge = policy()
    first = on_time(judge)
    assert first.reason is None and not first.late  # valid while still UNAVAILABLE(starting)
    assert judge.availability.state.availability is U
    assert on_time(judge).reason is None
    assert judge.availability.state.availability is A  # recover_after good frames


def test_a_frame_published_after_its_deadline_is_valid_flagged_late_and_a_good_result():
    judge = policy(unavailable_after=3)
    good(judge, 2)
    judge.invalid_output("NaN")
    judge.invalid_output("NaN")  # two failures in a row: one more would be an outage
    with TransitionRecorder(judge.availability) as recorder:
        verdicts = [
            judge.decoded(at=0.08, deadline=0.05, stale_at=0.1, calibration=None) for _ in range(12)
        ]
    assert all(v.reason is None and v.late and v.fault is None for v in verdicts)
    assert recorder.availabilities() == [D, A]  # lateness is no outage: good results
    assert judge.availability.failed_streak == 0


def test_a_frame_already_stale_when_it_could_be_warped_is_invalid_and_no_failure():
    judge = policy()
    good(judge, 2)
    verdict = judge.stale(0.1234, 1.0, "warped")
    assert verdict.reason == (
        "stale: the frame was 123.4 ms old when it could be warped (stale after 100 ms)"
    )
    assert verdict.timeouts == ("frame-stale",) and verdict.fault is None
    assert judge.availability.state.availability is A and judge.availability.failed_streak == 0


def test_a_frame_whose_output_was_not_ready_by_its_staleness_bound_is_stale():
    judge = policy()
    good(judge, 2)
    verdict = judge.over_budget(bound_ran_out(), at=1.0)
    assert verdict.reason.kind == "stale" and verdict.reason.detail.startswith(
        "no output within 100 ms: "
    )
    assert verdict.timeouts == ("frame-stale",) and verdict.fault is None
    assert judge.availability.state.availability is A


def test_an_output_ready_after_the_staleness_bound_is_stale_not_valid():
    judge = policy()
    good(judge, 2)
    verdict = judge.decoded(at=1.12, deadline=1.05, stale_at=1.1, calibration=None)
    assert verdict.reason == (
        "stale: its output was ready 120.0 ms after start of frame (stale after 100 ms)"
    )
    assert not verdict.late and judge.availability.state.availability is A


def test_a_frame_with_stale_calibration_is_invalid_and_degraded():
    judge = policy()
    good(judge, 2)
    verdict = on_time(judge, calibration=Reason("calibration missing or stale"))
    assert verdict.reason == "calibration missing or stale"
    assert judge.availability.state.availability is D


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


def test_a_failed_warp_is_an_isolated_failure():
    judge = policy()
    good(judge, 2)
    assert judge.warp_failed(ValueError("no geometry")).reason == "warp: no geometry"
    assert judge.availability.state.availability is D


def test_a_frame_that_finds_no_model_says_why_and_reports_nothing():
    judge = policy()
    good(judge, 2)
    verdict = judge.no_model("the accelerator is restarting")
    assert verdict.reason == "model unavailable: the accelerator is restarting"
    assert verdict.fault is None and judge.availability.state.availability is A


def test_a_hardware_fault_is_unavailable_at_once_under_its_layer():
    judge = policy()
    good(judge, 2)
    fault = SignalTimeout(awaited="compute timeline >= 9", timeout=0.1, elapsed=0.1)
    verdict = judge.device_fault(fault)
    assert verdict.fault is fault and verdict.timeouts == ("gpu-queue",)
    assert (verdict.reason.kind, verdict.reason.detail) == ("gpu-queue", fault.message)
    assert str(judge.availability.state).startswith("unavailable(gpu-queue: ")


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


# -- the rate: a host too slow or too busy for the camera -------------------------------------


def frames(judge: FramePolicy, start: float, count: int, lost_every: int | None = None) -> float:
    """``count`` frames at 20 Hz from ``start``: each arrives and is published valid on time,
    except every ``lost_every``-th, dropped. Returns the time after the last."""
    at = start
    for k in range(count):
        judge.arrived(at)
        if lost_every is not None and k % lost_every == 0:
            judge.dropped(at + 0.01)
        else:
            on_time(judge, at)
        at += PERIOD
    return at


def test_a_service_that_loses_frames_to_the_hosts_speed_is_degraded_with_the_rate_it_keeps():
    judge = policy(host=lambda: HostSample(0.0, 0.0))
    at = frames(judge, 0.0, 40)
    assert judge.availability.state.availability is A
    at = frames(judge, at, 40, lost_every=8)  # 5 of 40: above a tenth
    state = judge.availability.state
    assert state.availability is D and state.reason.kind == "overloaded"
    words = re.fullmatch(
        r"(\d+(?:\.5)?) of 20 Hz valid; its work takes longer than the camera's frame period",
        state.reason.detail,
    )
    assert words and 17 <= float(words[1]) <= 19  # 35 of 40 frames: 17.5 Hz, said within 1 Hz
    frames(judge, at, 60)  # keeping up again, once the window has no losses
    assert judge.availability.state.availability is A


def test_a_valid_rate_below_the_minimum_is_unavailable_and_says_so_never_a_device_fault():
    judge = policy(host=lambda: HostSample(0.0, 0.0))
    at = frames(judge, 0.0, 40)
    with TransitionRecorder(judge.availability) as recorder:
        at = frames(judge, at, 40, lost_every=3)  # a third lost: 13.5 of 20 Hz
    state = judge.availability.state
    assert state.availability is U and state.reason.kind == "overloaded"
    assert state.reason.detail.startswith("13.5 of 20 Hz valid, below the minimum 16 Hz; ")
    assert U in recorder.availabilities()
    assert on_time(judge, at).reason is None  # its frames are valid all the same


def test_the_minimum_rate_may_be_set():
    judge = policy(min_rate=10.0)
    at = frames(judge, 0.0, 40)
    frames(judge, at, 40, lost_every=3)
    state = judge.availability.state
    assert state.availability is D and "below the minimum" not in state.reason


def test_the_rate_s_words_change_when_the_rate_moves_by_a_hertz_not_with_every_frame():
    judge = policy()
    at = frames(judge, 0.0, 40)
    with TransitionRecorder(judge.availability) as recorder:
        frames(judge, at, 80, lost_every=6)  # ~16.7 of 20 Hz throughout
    overloaded = [s for s in recorder.states() if s.reason and s.reason.kind == "overloaded"]
    assert 1 <= len(overloaded) <= 3, [str(s) for s in overloaded]


@pytest.mark.parametrize(
    ("throttled", "waited", "cause"),
    [
        (0.2, 0.2, "throttled by its CPU quota"),
        (0.0, 0.4, "out-competed for the CPU"),
        (0.0, 0.01, "its work takes longer than the camera's frame period"),
    ],
)
def test_the_host_s_load_says_why_the_service_cannot_keep_up(throttled, waited, cause):
    seconds = [0.0]

    def host() -> HostSample:  # cumulative figures growing at the given rates
        return HostSample(throttled * seconds[0], waited * seconds[0])

    judge = policy(host=host)
    at = 0.0
    for k in range(80):
        seconds[0] = at
        judge.arrived(at)
        if k >= 40 and k % 3 == 0:
            judge.dropped(at)
        else:
            on_time(judge, at)
        at += PERIOD
    assert judge.availability.state.reason.detail.endswith(f"; {cause}")


def test_a_device_fault_is_the_device_s_not_the_host_s_the_rate_starts_again():
    judge = policy()
    at = frames(judge, 0.0, 40)
    for _ in range(6):  # lost while the device was hanging, before the hang was judged
        judge.arrived(at)
        judge.dropped(at)
        at += PERIOD
    assert judge.rate.verdict(at) is not None  # a seventh of the window: overloaded, so far
    judge.device_fault(SignalTimeout(awaited="compute timeline >= 9", timeout=0.1, elapsed=0.1))
    assert judge.rate.verdict(at) is None
    frames(judge, at, 10)
    assert judge.availability.state.availability is A


def test_frames_lost_while_the_service_is_starting_are_not_the_host_s():
    judge = policy(host=lambda: HostSample(0.0, 0.0))
    at = 0.0
    with TransitionRecorder(judge.availability) as recorder:
        judge.arrived(at)
        on_time(judge, at)  # a first valid frame: still starting (two to recover)
        at += PERIOD
        for _ in range(20):  # a second of slow first runs: lost before it is up
            judge.arrived(at)
            judge.dropped(at + 0.01)
            at += PERIOD
        frames(judge, at, 80)  # up, and keeping up from then on
    reasons = [s.reason.kind for s in recorder.states() if s.reason is not None]
    assert "overloaded" not in reasons, [str(s) for s in recorder.states()]
    assert judge.availability.state.availability is A


def test_a_frame_that_could_not_finish_by_its_bound_is_not_started():
    judge = policy()
    assert judge.admits(1.0, stale_at=1.01)  # nothing worked yet: every frame is tried...
    assert not judge.admits(1.0, stale_at=1.0)  # ...but one stale already
    for k in range(20):
        judge.worked(1.0 + k * PERIOD, 0.06 if k % 10 else 0.02)  # p95 of the work: 60 ms
    at = 2.0
    assert judge.admits(at, stale_at=at + 0.07)
    assert not judge.admits(at, stale_at=at + 0.05)
    # work seen more than a window ago says nothing of now: tried again
    assert judge.admits(at + RATE_WINDOW + 1.0, stale_at=at + RATE_WINDOW + 1.01)


def test_replaying_nothing_is_dropped_and_no_rate_is_judged():
    judge = policy(live=False)
    for k in range(20):
        judge.worked(k * PERIOD, 1.0)
    assert judge.admits(1.0, stale_at=1.01)
    at = 0.0
    for _ in range(80):
        judge.arrived(at)
        judge.dropped(at)
        at += PERIOD
    assert judge.rate.verdict(at) is None


def test_the_host_s_cpu_stat_says_how_long_a_quota_held_it_off_in_either_cgroup_version(
    tmp_path,
):
    from pipelines.dms.service import _host

    v1, v2 = tmp_path / "v1.stat", tmp_path / "v2.stat"
    v1.write_text("nr_periods 10\nnr_throttled 4\nthrottled_time 2500000000\n")
    v2.write_text("usage_usec 1\nnr_throttled 4\nthrottled_usec 1500000\n")
    assert _host._throttled(v1) == 2.5 and _host._throttled(v2) == 1.5
    assert _host._throttled(tmp_path / "none") == 0.0
    assert isinstance(_host.HostLoad().sample(), HostSample)  # this machine's, whatever it is


def test_no_frame_from_a_recorded_source_that_fell_behind_is_overload_not_a_camera_stall():
    judge = policy()
    good(judge, 2)
    stall = CameraTimeout(awaited="a camera frame", timeout=0.25, elapsed=0.25)
    verdict = judge.camera_stalled(stall, behind=7)
    assert verdict.reason.kind == "overloaded"
    assert verdict.reason.detail.startswith(
        "no frame for 0.25 s: the recorded input's reading falls behind (7 frames skipped); "
    )
    assert judge.availability.state.availability is U

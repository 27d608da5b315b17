"""The DMS availability policy: what each way a frame can end means for the service's availability.

A frame's result comes in (decoded, an invalid output, over its budget, a device fault, a stall of
the camera...); a report to the availability machine goes out, with the reason the frame is
published under (:class:`Verdict`). The hysteresis is the core's
(:class:`~aio_runtime.AvailabilityMachine`): ``recover_after`` good frames to be AVAILABLE again,
``unavailable_after`` frames in a row without a valid output make isolated failures an outage,
and one wording per kind of reason while it lasts. What is DMS-specific is here:

- UNAVAILABLE, at once: a hardware timeout or fault from the model's device, an accelerator that
  has been seen to make no progress for ``gpu_hang_after`` (it is then restarted), a camera that
  stops;
- DEGRADED: stale or missing calibration, a frame published late (its model run was still in
  progress at the deadline and went on, within :attr:`FramePolicy.grace`: its output is published,
  and it does not count toward ``unavailable_after``), an isolated frame without an output (over
  its budget, an invalid output, a failed warp);
- a frame that finds no model to run it says why and reports nothing (whoever is bringing the
  model up reports the availability meanwhile); a run superseded by a newer frame is a drop, not
  an outcome.

No I/O and no clock of its own: the results carry the times they are judged by (the
availability machine stamps its transitions).
"""

from __future__ import annotations

from dataclasses import dataclass

from aio_runtime import (
    Availability,
    AvailabilityMachine,
    BudgetExhausted,
    CameraTimeout,
    HardwareTimeout,
    Reason,
    RuntimeFault,
)

__all__ = ["FramePolicy", "Verdict"]

FRAME_BUDGET = "frame budget"
"""The kind of reason for a frame over its budget."""
BUDGET_TIMEOUT = "frame-budget"
"""The timeout counted (as its layer) for a frame over its budget."""
_RESOLUTION = 1e-9
"""Seconds within which evidence of no progress reaches the hang bound: the evidence is a sum of
intervals of the loop clock, which rounds."""


@dataclass(frozen=True)
class Verdict:
    """How a frame is published, and what else its result calls for."""

    reason: Reason | None = None
    """Why the frame is not valid (None: it is)."""
    fault: RuntimeFault | None = None
    """The device is at fault: the typed error its session fails with (and is restarted for,
    where it can be)."""
    timeouts: tuple[str, ...] = ()
    """The timeouts this frame met, by layer (counted in the metrics)."""


def _escalated(frames: int, reason: Reason) -> Reason:
    return Reason("no valid output", f"{frames} frames in a row; {reason}")


class FramePolicy:
    """Judges frames and reports them to :attr:`availability`, the service's availability."""

    def __init__(
        self,
        *,
        budget: float,
        gpu_hang_after: float,
        recover_after: int,
        unavailable_after: int,
    ) -> None:
        self.budget = budget
        self.gpu_hang_after = gpu_hang_after
        self.availability = AvailabilityMachine(
            recover_after=recover_after,
            escalate_after=unavailable_after,
            escalated=_escalated,
            per_kind=True,
            initial_reason="starting",
        )

    def _failed(self, reason: Reason, *timeouts: str) -> Verdict:
        """An isolated failure: no output this time."""
        return Verdict(self.availability.report_failed(reason), timeouts=timeouts)

    def too_old(self, age: float) -> Verdict:
        """The frame was ``age`` seconds old when it could be warped: past its budget already."""
        detail = (
            f"the frame was {age * 1e3:.1f} ms old when it could be warped "
            f"(budget {self.budget * 1e3:g} ms)"
        )
        return self._failed(Reason(FRAME_BUDGET, detail), BUDGET_TIMEOUT)

    def warp_failed(self, error: Exception) -> Verdict:
        return self._failed(Reason("warp", str(error)))

    @property
    def grace(self) -> float:
        """Seconds a model run still in progress at its frame's deadline may go on: its output is
        then published late. Long enough for the device to be judged by the hang rule
        (``gpu_hang_after``), and never shorter than a budget."""
        return max(self.budget, self.gpu_hang_after)

    def over_budget(self, exc: BudgetExhausted, stalled: float | None = None) -> Verdict:
        """The frame's bound ran out waiting for ``exc.awaited`` (a warp, its budget; a model
        run, its budget and the :attr:`grace` after it): no output, an isolated failure —
        unless the device has been seen to make no progress for ``stalled`` seconds,
        ``gpu_hang_after`` or more: hung (UNAVAILABLE, restarted)."""
        if stalled is None or stalled < self.gpu_hang_after - _RESOLUTION:
            return self._failed(Reason(FRAME_BUDGET, exc.message), BUDGET_TIMEOUT)
        detail = (
            f"the accelerator has made no progress for {stalled:.3f} s "
            f"(hung after {self.gpu_hang_after:g} s; {exc.message})"
        )
        reason = Reason(str(exc.layer), detail)
        self.availability.report_unavailable(reason)
        hung = HardwareTimeout(
            awaited=exc.awaited,
            timeout=self.gpu_hang_after,
            elapsed=stalled,
            layer=exc.layer,
            expected=exc.expected,
            observed=exc.observed,
            detail="the accelerator has made no progress: hung",
        )
        hung.__cause__ = exc
        return Verdict(reason, fault=hung, timeouts=(BUDGET_TIMEOUT, str(exc.layer)))

    def device_fault(self, exc: RuntimeFault) -> Verdict:
        """A hardware timeout or fault from the model's device: UNAVAILABLE, session
        restarted."""
        reason = Reason(str(exc.layer), exc.message)
        self.availability.report_unavailable(reason)
        return Verdict(reason, fault=exc, timeouts=(str(exc.layer),))

    @staticmethod
    def no_model(why: str) -> Verdict:
        """No model can run the frame (loading, restarting): said, not reported."""
        return Verdict(Reason("model unavailable", why))

    def invalid_output(self, why: str) -> Verdict:
        return self._failed(Reason("invalid output", why))

    def decoded(self, *, late: float, calibration: Reason | None) -> Verdict:
        """A valid output, decoded ``late`` seconds after the frame's deadline (negative: on
        time), with what is wrong with its calibration (None: nothing). A late one is published
        with its output, DEGRADED: a result produced, so it does not count toward
        ``unavailable_after``."""
        problem = calibration
        if problem is None and late > 0:
            problem = Reason(
                FRAME_BUDGET, f"late: decoded {late * 1e3:.1f} ms after the frame's deadline"
            )
        if problem is not None:
            self.availability.report_degraded(problem)
            return Verdict(problem)
        self.availability.report_good()
        state = self.availability.state
        if state.availability is Availability.AVAILABLE:
            return Verdict()
        # good frames, but not enough of them yet
        return Verdict(Reason("recovering", f"{state.availability} ({state.reason})"))

    def camera_stalled(self, exc: CameraTimeout) -> Verdict:
        """No frame for the stall period (reported again each period while it lasts)."""
        reason = Reason("camera", exc.message)
        self.availability.report_unavailable(reason)
        return Verdict(reason, timeouts=(str(exc.layer),))

    def camera_failed(self, error: str) -> None:
        """The camera source failed: it delivers nothing more."""
        self.availability.report_unavailable(Reason("camera", error), per_kind=False)

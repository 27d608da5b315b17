"""The DMS policy: whether each frame is valid, and what each way a frame can end means for the
service's availability.

A frame has two times (design C3, C13): its *deadline*, start of frame + ``budget`` — a valid
output published after it is still valid, and flagged *late* —, and its *staleness bound*, start
of frame + ``stale_after`` — every wait made for the frame ends there, and an output later than
it is of no use: the frame is published invalid, *stale*, without driver data. A frame is valid
when its output and its calibration are valid and its age at publication is within
``stale_after``, whatever the availability: the availability is said beside it, never instead.

Only the availability carries hysteresis (the core's :class:`~aio_runtime.AvailabilityMachine`:
``recover_after`` good frames to be AVAILABLE again, ``unavailable_after`` frames in a row
without a valid output make isolated failures an outage, one wording per kind of reason while it
lasts), and it follows the hardware and the outputs, not the host's speed:

- UNAVAILABLE, at once: a hardware timeout or fault from the model's device, an accelerator seen
  to make no progress for ``gpu_hang_after`` among them (judged by its runner, where time in
  which this host could not run is no evidence; it is restarted); a camera that stops;
- DEGRADED: stale or missing calibration; isolated frames without a valid output (an invalid
  output, a failed warp);
- a host too slow or too busy for the camera's rate (frames dropped, or stale, :mod:`._rate`):
  DEGRADED with the rate it achieves and why (``overloaded: 12.5 of 20 Hz valid; throttled by
  its CPU quota``), UNAVAILABLE while that rate is below ``min_rate``; stale frames and drops are
  otherwise no failures. Live, a frame that could not be published within ``stale_after``
  (judged from the recent frames' work from the model's hand-over on, their p95) is not
  started: dropped, counted;
- a frame that finds no model to run it says why and reports nothing (whoever is bringing the
  model up reports the availability meanwhile).

No clock of its own: the results carry the times they are judged by (the availability machine
stamps its transitions); the host's load is read through the ``host`` it is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aio_runtime import (
    Availability,
    AvailabilityMachine,
    BudgetExhausted,
    CameraTimeout,
    Reason,
    RuntimeFault,
)

from ._host import SAMPLE_EVERY, SLOW_WORK, HostSample, overload_cause
from ._rate import RATE_WINDOW, RateVerdict, RateWatch

__all__ = ["OVERLOADED", "STALE", "STALE_TIMEOUT", "FramePolicy", "Verdict"]

STALE = "stale"
"""The kind of reason for a frame whose output would be, or was, later than its staleness
bound."""
STALE_TIMEOUT = "frame-stale"
"""The timeout counted (as its layer) for a frame that met its staleness bound."""
OVERLOADED = "overloaded"
"""The kind of reason for a service that cannot keep up with the camera's rate."""
WORK_SAMPLES = 20
"""Recent frames whose work (handed to the model to published) predicts the next frame's..."""
WORK_HORIZON = 1.0
"""...among those of the last second: a frame is tried again once none is that recent..."""
WORK_PERCENTILE = 95
"""...and the share of them a frame started should finish within."""


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
    late: bool = False
    """A valid frame published after its deadline."""


def _escalated(frames: int, reason: Reason) -> Reason:
    return Reason("no valid output", f"{frames} frames in a row; {reason}")


class FramePolicy:
    """Judges frames and reports them to :attr:`availability`, the service's availability.

    ``live``: frames come from a camera (the rate is judged, frames that cannot finish in time
    are not started); replaying, neither (nothing is dropped). ``min_rate``: see
    :class:`~._rate.RateWatch`. ``host``: samples the host's load, to say why a service is
    overloaded (None: it is not said)."""

    def __init__(
        self,
        *,
        budget: float,
        stale_after: float,
        recover_after: int,
        unavailable_after: int,
        min_rate: float | None = None,
        live: bool = True,
        host: Callable[[], HostSample] | None = None,
    ) -> None:
        self.budget = budget
        self.stale_after = stale_after
        self.live = live
        self.availability = AvailabilityMachine(
            recover_after=recover_after,
            escalate_after=unavailable_after,
            escalated=_escalated,
            per_kind=True,
            initial_reason="starting",
        )
        self.rate = RateWatch(min_rate=min_rate)
        self._work: deque[tuple[float, float]] = deque(maxlen=WORK_SAMPLES)
        """(done at, seconds from handed to the model) of the latest worked frames."""
        self._host = host
        self._samples: deque[tuple[float, HostSample]] = deque()
        self._said: tuple[RateVerdict, str] | None = None
        """The rate verdict last said, and its cause."""

    # -- frames in ---------------------------------------------------------------------------

    def arrived(self, at: float) -> None:
        """A frame reached the service at ``at``."""
        if self.live:
            self.rate.arrived(at)
            self._sample_host(at)

    def admits(self, at: float, stale_at: float) -> bool:
        """Whether a frame handed to the model at ``at`` can still be published by
        ``stale_at``, judged from the recent frames' work from there (its p95: a frame started
        should be a frame published valid; while no frame was worked in the last
        :data:`WORK_HORIZON` seconds, any frame not stale yet). Replaying, every frame is."""
        if not self.live:
            return True
        while self._work and self._work[0][0] < at - WORK_HORIZON:
            self._work.popleft()
        if not self._work:
            return at < stale_at
        expected = float(np.percentile([seconds for _, seconds in self._work], WORK_PERCENTILE))
        return at + expected <= stale_at

    def worked(self, at: float, seconds: float) -> None:
        """A frame handed to the model ``seconds`` before ``at`` was done with at ``at``."""
        self._work.append((at, seconds))

    # -- frames that end without an output ---------------------------------------------------

    def dropped(self, at: float) -> None:
        """A frame was dropped at ``at`` (replaced by a newer one, not started, skipped): no
        failure, a frame lost to the host's speed."""
        self._lost(at)

    def stale(self, age: float, at: float, work: str) -> Verdict:
        """The frame was ``age`` seconds old when it could be ``work`` (warped, run): past its
        staleness bound already, published invalid, unworked."""
        detail = (
            f"the frame was {age * 1e3:.1f} ms old when it could be {work} "
            f"(stale after {self.stale_after * 1e3:g} ms)"
        )
        self._lost(at)
        return Verdict(Reason(STALE, detail), timeouts=(STALE_TIMEOUT,))

    def warp_failed(self, error: Exception) -> Verdict:
        return self._failed(Reason("warp", str(error)))

    def over_budget(self, exc: BudgetExhausted, at: float) -> Verdict:
        """The frame's staleness bound ran out at ``at`` waiting for ``exc.awaited`` (a warp, a
        model run): stale. (A device that makes no progress is judged by its own hang rule,
        :meth:`device_fault`.)"""
        self._lost(at)
        reason = Reason(STALE, f"no output within {self.stale_after * 1e3:g} ms: {exc.message}")
        return Verdict(reason, timeouts=(STALE_TIMEOUT,))

    def device_fault(self, exc: RuntimeFault) -> Verdict:
        """A hardware timeout or fault from the model's device (one seen to make no progress
        for its hang bound among them): UNAVAILABLE, session restarted. The frames lost while
        it was coming are the device's, not the host's: the rate's account starts again
        once the service is AVAILABLE again."""
        reason = Reason(str(exc.layer), exc.message)
        self.rate.forget()
        self.availability.report_unavailable(reason)
        return Verdict(reason, fault=exc, timeouts=(str(exc.layer),))

    @staticmethod
    def no_model(why: str) -> Verdict:
        """No model can run the frame (loading, restarting): said, not reported."""
        return Verdict(Reason("model unavailable", why))

    def invalid_output(self, why: str) -> Verdict:
        return self._failed(Reason("invalid output", why))

    # -- frames with an output ---------------------------------------------------------------

    def decoded(
        self, *, at: float, deadline: float, stale_at: float, calibration: Reason | None
    ) -> Verdict:
        """A valid output, to be published at ``at``, of a frame with that ``deadline`` and
        staleness bound, with what is wrong with its calibration (None: nothing): valid (and
        late, past the deadline) unless it is stale or its calibration is not valid."""
        if at > stale_at:
            self._lost(at)
            detail = (
                f"its output was ready {(at - stale_at + self.stale_after) * 1e3:.1f} ms after "
                f"start of frame (stale after {self.stale_after * 1e3:g} ms)"
            )
            return Verdict(Reason(STALE, detail), timeouts=(STALE_TIMEOUT,))
        if calibration is not None:
            self.availability.report_degraded(calibration)
            return Verdict(calibration)
        if self.live:
            self.rate.valid(at)
        overloaded = self._overloaded(at)
        if overloaded is None:
            self.availability.report_good()
            if self.live and not self.rate.started and self._available:
                self.rate.start(at)  # up: from here on, a frame lost is the host's
        elif self._below_minimum:
            self.availability.report_unavailable(overloaded, per_kind=False)
        else:
            self.availability.report_degraded(overloaded, per_kind=False)
        return Verdict(late=at > deadline)

    # -- the camera --------------------------------------------------------------------------

    def camera_stalled(self, exc: CameraTimeout, *, behind: int = 0) -> Verdict:
        """No frame for the stall period (reported again each period while it lasts); a
        recorded source that skipped ``behind`` frames meanwhile (-1: some before, and it has
        not caught up since) has fallen behind instead, the host too slow to read it:
        overloaded, with what the host shows."""
        if behind:
            skipped = f"{behind} frames skipped" if behind > 0 else "catching up"
            detail = (
                f"no frame for {exc.timeout:g} s: the recorded input's reading falls behind "
                f"({skipped}); {self._cause()}"
            )
            reason = Reason(OVERLOADED, detail)
        else:
            reason = Reason("camera", exc.message)
        self.availability.report_unavailable(reason)
        return Verdict(reason, timeouts=(str(exc.layer),))

    def camera_failed(self, error: str) -> None:
        """The camera source failed: it delivers nothing more."""
        self.availability.report_unavailable(Reason("camera", error), per_kind=False)

    # -- inside ------------------------------------------------------------------------------

    def _failed(self, reason: Reason) -> Verdict:
        """An isolated failure: no output this time."""
        return Verdict(self.availability.report_failed(reason))

    def _lost(self, at: float) -> None:
        """A frame lost to the host's speed: an outage once the valid rate is below the
        minimum."""
        if not self.live:
            return
        self.rate.lost(at)
        overloaded = self._overloaded(at)
        if overloaded is not None and self._below_minimum:
            self.availability.report_unavailable(overloaded, per_kind=False)

    @property
    def overloaded(self) -> bool:
        """The service cannot keep up with its camera, as last judged."""
        return self._said is not None

    @property
    def _available(self) -> bool:
        return self.availability.state.availability is Availability.AVAILABLE

    @property
    def _below_minimum(self) -> bool:
        return self._said is not None and self._said[0].below_minimum

    def _overloaded(self, at: float) -> Reason | None:
        """The reason the service is overloaded at ``at`` (None: it keeps up). Its words change
        when the valid rate moves by a hertz or more, crosses the minimum, or its cause changes:
        not with every frame."""
        verdict = self.rate.verdict(at, below=self._below_minimum) if self.live else None
        if verdict is None:
            self._said = None
            return None
        cause = self._cause()
        said = self._said
        recovering = verdict.below_minimum and verdict.valid_rate >= verdict.minimum
        kept = said is not None and (
            (recovering and said[0].below_minimum)  # not yet clear of it: as it was said
            or (
                abs(said[0].valid_rate - verdict.valid_rate) < 1.0
                and said[0].below_minimum == verdict.below_minimum
                and said[1] == cause
            )
        )
        if said is None or not kept:
            said = self._said = (verdict, cause)
        return Reason(OVERLOADED, f"{said[0].describe()}; {said[1]}")

    def _sample_host(self, at: float) -> None:
        if self._host is None or (self._samples and at - self._samples[-1][0] < SAMPLE_EVERY):
            return
        self._samples.append((at, self._host()))
        since = at - RATE_WINDOW - SAMPLE_EVERY  # the window's, and one sample before it
        while self._samples and self._samples[0][0] < since:
            self._samples.popleft()

    def _cause(self) -> str:
        """Why the service cannot keep up, from the host's load over the window."""
        if len(self._samples) < 2:
            return SLOW_WORK
        (first, earlier), (last, later) = self._samples[0], self._samples[-1]
        return overload_cause(earlier, later, last - first)

"""The rate the service keeps up with: frames the camera delivered, frames published valid and
frames lost to the host's speed, over the last :data:`RATE_WINDOW` seconds.

A host too slow or too busy for the camera's rate does not make frames wrong: it makes fewer of
them. A frame is *lost* to the host's speed when it is dropped (replaced by a newer one while it
waited for a stage, not started because it could not finish in time, skipped by a recorded source
that fell behind) or ends stale. When at least :data:`OVERLOADED_SHARE` of the window's frames were
lost (and :data:`OVERLOADED_LOSSES` at least), the service is *overloaded*: it says so with the rate
it achieves, DEGRADED, or UNAVAILABLE while that rate is below the minimum its consumer needs. The
account starts when the service is first AVAILABLE, and again once it is after a device's failure
(a service starting, its first runs slow, or coming back, is not a slow host: the frames it lost
before are not counted), and is judged once it is a window old. Plain bookkeeping: the times are
given, on the loop clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = [
    "MIN_RATE_SHARE",
    "OVERLOADED_LOSSES",
    "OVERLOADED_SHARE",
    "RATE_WINDOW",
    "RateVerdict",
    "RateWatch",
]

RATE_WINDOW = 2.0
"""Seconds of frames the rate is judged over (40 frames at 20 Hz)."""
OVERLOADED_SHARE = 0.10
"""The share of the window's frames lost to the host's speed from which the service is
overloaded (4 of 40 at 20 Hz)..."""
OVERLOADED_LOSSES = 3
"""...and the fewest frames lost that it takes: two frames are an incident, not a rate."""
MIN_RATE_SHARE = 0.8
"""The minimum rate, by default, as a share of the camera's: openpilot's consumer checks its
inputs' rates against 0.8 of what they should be (16 Hz of a 20 Hz service)."""
RATE_MARGIN = 1.0
"""Hertz above the minimum a valid rate below it must reach to be above it again: a rate that
hovers about the minimum is one outage, not one per frame."""
_JUDGED_AFTER = 10
"""Frames delivered in the window before the rate is judged at all."""


@dataclass(frozen=True)
class RateVerdict:
    """An overloaded service: the rates it achieves over the window, and its minimum."""

    valid_rate: float
    """Frames published valid per second."""
    camera_rate: float
    """Frames the camera delivered per second."""
    minimum: float
    """The valid rate below which the service is unavailable."""
    below_minimum: bool
    """Below the minimum (once below, until :data:`RATE_MARGIN` above it)."""

    def describe(self) -> str:
        """``12.5 of 20 Hz valid`` (and ``, below the minimum 16 Hz`` when it is): the valid rate
        to the half hertz, so that the words change only when the rate does."""
        text = f"{round(self.valid_rate * 2) / 2:g} of {self.camera_rate:.0f} Hz valid"
        if self.below_minimum:
            text += f", below the minimum {self.minimum:.3g} Hz"
        return text


class RateWatch:
    """The window's frames: :meth:`arrived`, :meth:`valid` and :meth:`lost` as they happen,
    counted from :meth:`start` on; :meth:`verdict` judges them. ``min_rate``: the minimum valid rate (None:
    :data:`MIN_RATE_SHARE` of the camera's)."""

    def __init__(self, *, min_rate: float | None = None, window: float = RATE_WINDOW) -> None:
        self.min_rate = min_rate
        self.window = window
        self._arrived: deque[float] = deque()
        self._valid: deque[float] = deque()
        self._lost: deque[float] = deque()
        self._first: float | None = None
        """When the account started (None: not yet)."""

    @property
    def started(self) -> bool:
        return self._first is not None

    def start(self, at: float) -> None:
        """Start the account with the valid frame published at ``at`` (the service is
        AVAILABLE)."""
        self._first = at
        self._arrived.append(at)  # the frame arrived before it was started: counted with it
        self._valid.append(at)

    def arrived(self, at: float) -> None:
        if self._first is not None:
            self._arrived.append(at)

    def valid(self, at: float) -> None:
        if self._first is not None:
            self._valid.append(at)

    def lost(self, at: float) -> None:
        if self._first is not None:
            self._lost.append(at)

    def forget(self) -> None:
        """Stop the account until it is started again: what the window held was not the
        host's doing (a device that failed)."""
        self._arrived.clear()
        self._valid.clear()
        self._lost.clear()
        self._first = None

    def verdict(self, at: float, *, below: bool = False) -> RateVerdict | None:
        """The verdict at ``at``: None while the service keeps up (or too little is known to
        tell: the account is younger than the window, or fewer than 10 frames came in it).
        ``below``: the last verdict was below the minimum."""
        since = at - self.window
        for times in (self._arrived, self._valid, self._lost):
            while times and times[0] < since:
                times.popleft()
        delivered = len(self._arrived)
        if self._first is None or at - self._first < self.window or delivered < _JUDGED_AFTER:
            return None  # a window's worth of frames first: a service's first runs are slow
        lost = len(self._lost)
        if lost < OVERLOADED_LOSSES or lost < OVERLOADED_SHARE * delivered:
            return None
        span = self.window
        camera = delivered / span
        minimum = MIN_RATE_SHARE * camera if self.min_rate is None else self.min_rate
        valid = len(self._valid) / span
        return RateVerdict(valid, camera, minimum, valid < minimum + (RATE_MARGIN if below else 0))

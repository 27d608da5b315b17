"""A frame in flight through the service: what it carries from stage to stage."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from aio_runtime import Deadline, deadline_scope

from ..camera import Frame
from ._calibration import Calibrated

__all__ = ["FrameJob"]


@dataclass
class FrameJob:
    """One frame between the camera and publication. ``number`` counts frames as they reach the
    service (from 0); ``deadline`` is its start of frame plus the budget, on the loop clock."""

    frame: Frame
    number: int
    deadline: float
    image: np.ndarray | None = None
    """The warped luma, once warped."""
    calibration: Calibrated | None = None
    """The calibration the model ran with (None: none was fresh enough to use)."""
    output: np.ndarray | None = None
    """The model's flat output, once run."""
    device_time: float = 0.0
    """Seconds the model's device spent on it."""
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage, by stage."""

    @property
    def start(self) -> float:
        """Its start of frame, on the loop clock: where its budget begins."""
        return self.frame.timestamp_sof / 1e9

    def budget_scope(self) -> AbstractContextManager[Deadline]:
        """The frame's deadline as a scope: every wait made for the frame inside it is bounded
        by what is left of the budget (:class:`~aio_runtime.BudgetExhausted` past it)."""
        name = f"frame {self.frame.frame_id}"
        return deadline_scope(at=self.deadline, started=self.start, name=name)

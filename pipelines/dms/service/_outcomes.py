"""How frames end, in one place: every frame that reaches the service ends as exactly one of
published valid, published invalid with a reason, or dropped and counted (design C7).

:class:`FrameOutcomes` is the only code that counts frames (:class:`Summary`), updates the frame
metrics, numbers messages (``seq``), builds them and hands them to the sinks. It also keeps the
summary's record of availability changes, and tells the metrics where the series kept elsewhere
are read (the sinks' drops; the device's restarts and model).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import anyio
import numpy as np

from aio_runtime import (
    AvailabilityMachine,
    Readiness,
    ReadinessLayer,
    get_logger,
    now,
)

from ..config.kinds import Mode
from ..frames.source import clock_ns
from ..messages import DriverStateV2, new_run_id, readiness_record
from ..model.decode import DriverStateFields
from ..sinks.base import ReaderClosed, Sink, SinkError, SinkStats
from ..sinks.memory import Subscriptions
from ..sinks.publish import Sinks
from ._job import FrameJob
from ._policy import FramePolicy, Verdict
from .metrics import DeviceFacts, Metrics
from .slots import FrameAccounting

__all__ = ["FRAME_AGES_KEPT", "FrameOutcomes", "Summary"]

FRAME_AGES_KEPT = 100_000
"""Frame ages kept for the summary's percentiles: the latest ~80 minutes at 20 Hz."""

_log = get_logger(__name__)

SHUTDOWN = "shutdown"
"""Where frames still in flight as the service stops are dropped."""
CAMERA = "camera"
"""Where the frames a recorded source skipped are dropped."""
_MODEL_STAGES = ("warp", "model")
"""The stages a message's ``modelExecutionTime`` adds up."""


class ModelDeviceView(DeviceFacts, Protocol):
    """What the frame outcomes read of the model's device: its readiness layers as they are now
    (each message marks its own frame's on them), its restarts and its model (the metrics')."""

    @property
    def readiness(self) -> Readiness: ...


@dataclass
class Summary:
    frames: FrameAccounting
    frame_ages: deque[float] = field(default_factory=lambda: deque(maxlen=FRAME_AGES_KEPT))
    """The latest frames' ages (bounded: a service runs for days)."""
    transitions: list[tuple[float, str]] = field(default_factory=list)
    camera_error: str | None = None
    """Why the camera source failed, if it did (the service then ended)."""
    sink_error: str | None = None
    """Why a sink failed, if one did (the service then ended)."""
    reader_closed: str | None = None
    """Standard output was closed by its reader (the service then ended, as if stopped)."""
    sinks: list[SinkStats] = field(default_factory=list)
    """Each sink's counts, once the service has closed them."""

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.frame_ages, q) * 1000) if self.frame_ages else math.nan


@runtime_checkable
class _Completes(Protocol):
    """A sink whose output is kept only for a complete replay."""

    def complete(self) -> None: ...


class FrameOutcomes:
    """Ends frames: publishes them (valid or invalid) or drops them, counted.

    ``policy``: judges frames; it hears of every frame that arrives and of every one dropped
    (but at shutdown), and its availability is the one every message carries. ``device``: the
    model's device. Each message marks on its readiness layers as they are now whether its own
    frame's task completed and its output was valid — layered, as the core's readiness is: never
    up while a layer below is down — so the health endpoints report the last message's.
    """

    def __init__(
        self,
        policy: FramePolicy,
        device: ModelDeviceView,
        *,
        raw_predictions: bool = False,
        mode: Mode = Mode.LIVE,
        run_id: str | None = None,
    ) -> None:
        self.policy = policy
        self.availability: AvailabilityMachine = policy.availability
        self.run_id = run_id or new_run_id()
        """Every message's ``runId``: as given, or fresh."""
        self.metrics = Metrics()
        self.summary = Summary(FrameAccounting())
        self.mode = mode
        self.subscriptions = Subscriptions(delivery=mode)
        """The in-process sink: every message, to every subscriber."""
        self.sinks = Sinks([self.subscriptions])
        """Every sink, each with the policy of the service's mode."""
        self.metrics.read_from(sinks=self.sinks.stats, device=device)
        self._device = device
        self._raw_predictions = raw_predictions
        self._in_flight: dict[int, FrameJob] = {}
        """Frames received and not yet published or dropped, by number."""
        self._seq = 0
        self._newest_sof: int | None = None
        """The newest frame's start of frame (ns)."""

    def add_sinks(self, sinks: list[Sink]) -> None:
        """Publish to ``sinks`` too, each with the policy of the service's mode."""
        for sink in sinks:
            self.sinks.add(sink)

    def ended(self) -> None:
        """The frames ended by themselves (the camera's end, or the frames or the duration asked
        for): unless the camera failed, the replay is complete, and a sink that keeps its output
        only for a complete replay (a Parquet file) is told so, to complete it as it closes."""
        if self.summary.camera_error is None:
            for sink in self.sinks:
                if isinstance(sink, _Completes):
                    sink.complete()

    async def room(self) -> None:
        """Replaying: wait until every sink has room for the next frame's messages."""
        await self.sinks.room()

    async def watch_sinks(self) -> SinkError:
        """Wait for a sink to fail (or its reader to close it): recorded in the summary, and
        returned."""
        failure = await self.sinks.wait_failure()
        if failure is None:  # every sink closed without failing: nothing to report, ever
            await anyio.Event().wait()
        assert failure is not None
        if isinstance(failure, ReaderClosed):
            self.summary.reader_closed = str(failure)
        else:
            self.summary.sink_error = str(failure)
        return failure

    async def close_sinks(self) -> None:
        """Close every sink, each draining within its bound; their counts go to the summary. A
        sink that failed as it closed (its last write, a file it could not complete) fails the
        run as one that fails before."""
        self.summary.sinks = await self.sinks.aclose()
        failed = next((sink.failed for sink in self.summary.sinks if sink.failed), None)
        if failed is not None and self.summary.sink_error is None:
            self.summary.sink_error = failed

    # -- frames in -----------------------------------------------------------------------------

    def arrived(self, job: FrameJob) -> None:
        self._in_flight[job.number] = job
        self._newest_sof = job.frame.timestamp_sof
        self.summary.frames.receive()
        self.metrics.frames_in.inc()
        at = clock_ns()
        camera = max(0.0, at / 1e9 - job.frame.timestamp_sof / 1e9)
        self.metrics.stage_latency.labels(stage="camera").observe(camera)
        self.policy.arrived(at / 1e9)

    def skipped(self, frames: int) -> None:
        """A recorded source skipped ``frames`` frames, having fallen behind: each reached the
        service and was dropped there, at the camera (C7)."""
        for _ in range(frames):
            self.summary.frames.receive()
            self.metrics.frames_in.inc()
            self.summary.frames.drop(CAMERA)
            self.metrics.frames_dropped.labels(stage=CAMERA).inc()
            self.policy.arrived(now())
            self.policy.dropped(now())

    def camera_failed(self, error: str) -> None:
        """The camera failed for good (the service then ends): the summary says why."""
        self.summary.camera_error = error

    def stage_done(self, job: FrameJob, stage: str, seconds: float) -> None:
        job.stages[stage] = seconds
        self.metrics.stage_latency.labels(stage=stage).observe(seconds)

    # -- frames out ----------------------------------------------------------------------------

    def dropped(self, stage: str, job: FrameJob) -> None:
        if self._in_flight.pop(job.number, None) is None:
            return  # already ended
        self.summary.frames.drop(stage)
        self.metrics.frames_dropped.labels(stage=stage).inc()
        if stage != SHUTDOWN:
            self.policy.dropped(now())

    def drop_in_flight(self) -> None:
        """The service stops: frames still waiting or being worked on are dropped, counted."""
        for job in list(self._in_flight.values()):
            self.dropped(SHUTDOWN, job)

    def invalid(
        self,
        job: FrameJob,
        verdict: Verdict,
        *,
        output: np.ndarray | None = None,
        at: float | None = None,
    ) -> None:
        """Publish the frame invalid, for ``verdict.reason`` (``output``: what the model gave, if
        it gave anything; ``at``: the instant it was judged at, its age's end — else now)."""
        self.count_timeouts(verdict)
        self._publish(job, verdict, output=output, at=at)

    def decoded(
        self, job: FrameJob, verdict: Verdict, fields: DriverStateFields, *, at: float
    ) -> None:
        """Publish a decoded frame: valid unless ``verdict`` says why not; its age is to ``at``,
        the instant the verdict was made at (so that its age says what the verdict does)."""
        self._publish(
            job,
            verdict,
            at=at,
            fields=fields,
            output=job.output,
            model_time=sum(job.stages.get(stage, 0.0) for stage in _MODEL_STAGES),
            device_time=job.device_time,
        )

    def status(self, verdict: Verdict) -> None:
        """A message for no frame (``frameId`` -1, no timestamps; ``frameAge``: the age of the
        newest frame, 0 if none came), for ``verdict``'s reason: published while frames do not
        arrive, or when the device fails in a run whose frame has ended, so a consumer on every
        sink hears of it at once instead of silence."""
        self.count_timeouts(verdict)
        newest = self._newest_sof
        age = 0.0 if newest is None else max(0.0, clock_ns() / 1e9 - newest / 1e9)
        self._send(
            DriverStateV2(
                seq=self._seq,
                run_id=self.run_id,
                frame_id=-1,
                timestamp_sof=0,
                timestamp_eof=0,
                frame_age=age,
                availability=self.availability.state.availability,
                reason=verdict.reason or "",
                availability_reason=self.availability.state.reason or "",
                valid=False,
                readiness=self._layers(task_complete=False, output_valid=False),
                log_mono_time=clock_ns(),
            )
        )

    def count_timeouts(self, verdict: Verdict) -> None:
        """Count the timeouts ``verdict`` met (for a frame published already, or none)."""
        for layer in verdict.timeouts:
            self.metrics.timeouts.labels(layer=layer).inc()

    def _publish(
        self,
        job: FrameJob,
        verdict: Verdict,
        *,
        fields: DriverStateFields | None = None,
        output: np.ndarray | None = None,
        model_time: float = 0.0,
        device_time: float = 0.0,
        at: float | None = None,
    ) -> None:
        start = time.perf_counter()
        frame = job.frame
        age = max(0.0, (clock_ns() / 1e9 if at is None else at) - frame.timestamp_sof / 1e9)
        raw = None
        if output is not None and self._raw_predictions:
            raw = output.astype("<f4").tobytes()
        valid = verdict.reason is None and fields is not None
        state = self.availability.state
        message = DriverStateV2(
            seq=self._seq,
            run_id=self.run_id,
            frame_id=frame.frame_id,
            timestamp_sof=frame.timestamp_sof,
            timestamp_eof=frame.timestamp_eof,
            frame_age=age,
            availability=state.availability,
            reason=verdict.reason or "",
            availability_reason=state.reason or "",
            valid=valid,
            late=valid and verdict.late,
            readiness=self._layers(
                task_complete=output is not None or fields is not None,
                output_valid=fields is not None,
            ),
            model_execution_time=model_time,
            gpu_execution_time=device_time,
            wheel_on_right_prob=None if fields is None else fields.wheel_on_right_prob,
            left_driver_data=None if fields is None else fields.left_driver_data.to_dict(),
            right_driver_data=None if fields is None else fields.right_driver_data.to_dict(),
            raw_predictions=raw,
            recorded_sof=frame.recorded_sof,
            recorded_eof=frame.recorded_eof,
            log_mono_time=clock_ns(),
        )
        self._in_flight.pop(job.number, None)
        self._send(message)
        kind = self.summary.frames.published(message.valid, message.reason, late=message.late)
        self.summary.frame_ages.append(age)
        metrics = self.metrics
        metrics.frames_published.labels(valid=str(message.valid).lower()).inc()
        if message.late:
            metrics.frames_late.inc()
        if kind is not None:  # invalid: under the kind the summary counted it under
            metrics.invalid_frames.labels(kind=kind).inc()
        metrics.end_to_end.observe(age)
        metrics.stage_latency.labels(stage="publish").observe(time.perf_counter() - start)

    def _layers(self, *, task_complete: bool, output_valid: bool) -> dict[str, bool]:
        """The device's readiness, with this message's task-complete and output-valid layers
        marked on it (the health endpoints then report the last message's)."""
        readiness = self._device.readiness
        _mark(
            readiness, ReadinessLayer.TASK_COMPLETE, task_complete, "the frame produced no output"
        )
        _mark(
            readiness, ReadinessLayer.OUTPUT_VALID, output_valid, "the frame's output is not valid"
        )
        return readiness_record(readiness)

    def _send(self, message: DriverStateV2) -> None:
        self._seq += 1
        self.sinks.publish(message)

    async def follow_availability(self) -> None:
        """Record every availability change: the summary, the metrics' gauge and transitions
        (a change of state, not of reason alone), the log."""
        with self.availability.subscribe() as stream:
            async for transition in stream:
                current, previous = transition.current, transition.previous
                self.metrics.set_availability(current.availability)
                if previous is not None and previous.availability is not current.availability:
                    self.metrics.transition(current.availability)
                self.summary.transitions.append((current.since, str(current)))
                _log.info("availability", state=str(current))


def _mark(readiness: Readiness, layer: ReadinessLayer, up: bool, reason: str) -> None:
    """Mark a frame's layer: up only where the layers below it hold (a device that went down
    meanwhile takes the frame's layers down with it)."""
    if not up:
        readiness.mark_down(layer, reason)
        return
    with contextlib.suppress(ValueError):  # a layer below is down: so is this one, already
        readiness.mark_up(layer)

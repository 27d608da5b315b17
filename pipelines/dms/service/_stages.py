"""The frame's path: camera → warp → model → decode → publish, one task per stage.

Stages are joined by slots holding at most one frame: live, latest-frame-wins (a frame replaced by
a newer one is dropped and counted); replaying, hand-off slots (each stage waits for the next).
Each stage takes what it works with explicitly and ends every frame through
:class:`~pipelines.dms.service._outcomes.FrameOutcomes`, judged by
:class:`~pipelines.dms.service._policy.FramePolicy`. Every wait made for a frame is bounded by its
deadline (:meth:`FrameJob.budget_scope`) — a model run by its deadline and the policy's grace,
within which a late run still publishes its output. When the camera ends, the stages end in
order — each closes the next slot once it has finished what it holds — so frames in flight are
finished (each bounded), not lost.
"""

from __future__ import annotations

import functools
import time

import anyio
import numpy as np

from aio_runtime import (
    BudgetExhausted,
    CameraTimeout,
    RuntimeFault,
    WorkerThread,
    deadline_scope,
    now,
    run_in_thread,
)

from ..camera import CABIN_CAMERAS, Frame
from ..channels import HandoffSlot, LatestSlot, SlotClosed
from ..config import Mode
from ..model_runner import RunSuperseded
from ..warp import MODEL_INPUT_SIZE, Warper
from ._calibration import CalibrationState
from ._camera import Camera
from ._device import DeviceSession, ModelDevice
from ._faults import ServiceFaults
from ._job import FrameJob, JobSlot
from ._outcomes import FrameOutcomes
from ._policy import FramePolicy, Verdict

__all__ = ["Decode", "Model", "Warp", "Warpers", "plan_warps", "run_stages"]


Warpers = dict[tuple[int, int, int], Warper]
"""One warper per frame geometry (width, height, stride)."""


async def run_stages(
    camera: Camera,
    warp: Warp,
    model: Model,
    decode: Decode,
    outcomes: FrameOutcomes,
    mode: Mode = Mode.LIVE,
) -> None:
    """Run the frame's path until the camera ends and every frame in flight has ended: live,
    through latest-frame-wins slots; replaying, through hand-off slots (nothing dropped)."""

    def slot(stage: str) -> JobSlot:
        if mode is Mode.REPLAY:
            return HandoffSlot(stage, camera.handed_on if stage == "warp" else None)
        return LatestSlot(stage, functools.partial(outcomes.dropped, stage))

    to_warp, to_model, to_decode = slot("warp"), slot("model"), slot("decode")
    async with anyio.create_task_group() as stages:
        stages.start_soon(warp.run, to_warp, to_model)
        stages.start_soon(model.run, to_model, to_decode)
        stages.start_soon(decode.run, to_decode)
        await camera.run(to_warp)


def plan_warps() -> Warpers:
    """A warper for each cabin camera, planned (blocking: on a worker thread)."""
    warpers = {}
    for camera in CABIN_CAMERAS:
        key = (camera.width, camera.height, camera.layout.stride)
        warpers[key] = Warper()
        warpers[key].plan_for(*key)
    return warpers


class Warp:
    """The model's input image from each frame, on a worker thread of its own; a frame already
    past its deadline is not warped (nothing done for it could still be on time)."""

    def __init__(
        self,
        warpers: Warpers,
        *,
        cpus: frozenset[int] | None,
        policy: FramePolicy,
        outcomes: FrameOutcomes,
    ) -> None:
        self.warpers = warpers
        self.cpus = cpus
        self.policy = policy
        self.outcomes = outcomes

    async def run(self, inbox: JobSlot, outbox: JobSlot) -> None:
        worker = WorkerThread("warp", cpus=self.cpus)
        try:
            while True:
                try:
                    job = await inbox.get()
                except SlotClosed:
                    break
                if await self._warp(job, worker):
                    await outbox.send(job)
        finally:
            worker.close()
        outbox.close()

    async def _warp(self, job: FrameJob, worker: WorkerThread) -> bool:
        start = time.perf_counter()
        frame = job.frame
        if now() >= job.deadline:  # stale: nothing done for it could still be on time
            self.outcomes.invalid(job, self.policy.too_old(now() - job.start))
            return False
        key = (frame.width, frame.height, frame.stride)
        warper = self.warpers.get(key)
        if warper is None:  # a geometry no cabin camera has: planned on first use
            warper = self.warpers[key] = Warper()
        try:
            with job.budget_scope():
                job.image = await run_in_thread(
                    functools.partial(_warp, warper, frame),
                    worker=worker,
                    awaited=f"warp of frame {frame.frame_id}",
                    error=CameraTimeout,
                )
        except BudgetExhausted as exc:
            self.outcomes.invalid(job, self.policy.over_budget(exc))
            return False
        except (RuntimeFault, ValueError) as exc:
            self.outcomes.invalid(job, self.policy.warp_failed(exc))
            return False
        self.outcomes.stage_done(job, "warp", time.perf_counter() - start)
        return True


def _warp(warper: Warper, frame: Frame) -> np.ndarray:
    """On a worker thread: the frame's luma, warped into a fresh array (the next frame must not
    overwrite what the model is reading)."""
    out = np.empty((1, MODEL_INPUT_SIZE), np.uint8)
    return warper.warp(frame.buffer, frame.width, frame.height, frame.stride, out=out)


class Model:
    """The model on each warped frame, on the device's current session. A backend that runs
    back to back is handed each frame as soon as it is warped: its run waits on the runner's
    thread and starts the moment the run in progress returns, unless a newer frame replaces it
    first (dropped, counted). Otherwise one frame at a time. A run still in progress at its
    frame's deadline is not cut there: it may go on for the policy's grace, and its output is
    then published late (DEGRADED); past the grace it is cut — no output, or a hung device if
    the device was seen to make no progress."""

    def __init__(
        self,
        device: ModelDevice,
        calibration: CalibrationState,
        *,
        policy: FramePolicy,
        outcomes: FrameOutcomes,
        overlap: bool = True,
    ) -> None:
        self.device = device
        self.calibration = calibration
        self.policy = policy
        self.outcomes = outcomes
        self.overlap = overlap
        """Hand frames to a back-to-back backend as they come (live); replaying, one at a time,
        so that no run is superseded."""

    async def run(self, inbox: JobSlot, outbox: JobSlot) -> None:
        async with anyio.create_task_group() as runs:
            while True:
                try:
                    job = await inbox.get()
                except SlotClosed:
                    break
                session = self.device.current
                if session is not None and session.backend.runs_back_to_back and self.overlap:
                    runs.start_soon(self._step, job, session, outbox)
                else:
                    await self._step(job, session, outbox)
        outbox.close()

    async def _step(self, job: FrameJob, session: DeviceSession | None, outbox: JobSlot) -> None:
        if await self._infer(job, session):
            await outbox.send(job)  # decoding and publishing it overlaps the next run

    async def _infer(self, job: FrameJob, session: DeviceSession | None) -> bool:
        """Run the model on the frame: True with ``job.output`` set, False once it has ended."""
        if session is None:  # whoever brings the device up reports the availability meanwhile
            self.outcomes.invalid(job, self.policy.no_model(self.device.why_unavailable(None)))
            return False
        job.calibration = self.calibration.latest
        vector = job.calibration.values if job.calibration is not None else _NO_CALIBRATION
        assert job.image is not None
        start = time.perf_counter()
        try:
            # A run still in progress at the deadline goes on, its output published late, within
            # the policy's grace: the frame's bound is its deadline and the grace after it.
            with deadline_scope(
                at=job.deadline + self.policy.grace,
                started=job.start,
                name=f"frame {job.frame.frame_id} and its grace",
            ):
                inference = await session.backend.infer(job.image, vector)
        except RunSuperseded:  # a newer frame took its place before it started
            self.outcomes.dropped("model", job)
            return False
        except BudgetExhausted as exc:
            await self._over_budget(job, session, exc)
            return False
        except RuntimeFault as exc:
            self._device_fault(job, session, exc)
            return False
        self.outcomes.stage_done(job, "model", time.perf_counter() - start)
        job.output, job.device_time = inference
        return True

    async def _over_budget(
        self, job: FrameJob, session: DeviceSession, exc: BudgetExhausted
    ) -> None:
        """No output within the grace — hung, if the device was seen to make no progress."""
        stalled = None if session.failing else await session.backend.stalled_for()
        self._end(job, session, self.policy.over_budget(exc, stalled))

    def _device_fault(self, job: FrameJob, session: DeviceSession, exc: RuntimeFault) -> None:
        if session.failing:  # the session is being replaced: this is a consequence
            why = self.device.why_unavailable(session)
            self.outcomes.invalid(job, self.policy.no_model(why))
            return
        self._end(job, session, self.policy.device_fault(exc))

    def _end(self, job: FrameJob, session: DeviceSession, verdict: Verdict) -> None:
        self.outcomes.invalid(job, verdict)
        if verdict.fault is not None:
            session.fail(verdict.fault)


_NO_CALIBRATION = np.zeros((1, 3), np.float32)


class Decode:
    """The model's output decoded into the driverStateV2 fields, judged and published."""

    def __init__(
        self,
        device: ModelDevice,
        calibration: CalibrationState,
        *,
        faults: ServiceFaults,
        policy: FramePolicy,
        outcomes: FrameOutcomes,
    ) -> None:
        self.device = device
        self.calibration = calibration
        self.faults = faults
        self.policy = policy
        self.outcomes = outcomes

    async def run(self, inbox: JobSlot) -> None:
        while True:
            try:
                job = await inbox.get()
            except SlotClosed:
                return
            self.finish(job)

    def finish(self, job: FrameJob) -> None:
        start = time.perf_counter()
        output = job.output
        assert output is not None
        if self.faults.output_is_nan(job.number):
            output = np.full_like(output, np.nan)
        decoded = self.device.decoder(output)
        self.outcomes.stage_done(job, "decode", time.perf_counter() - start)
        if not decoded.valid or decoded.fields is None:
            self.outcomes.invalid(job, self.policy.invalid_output(decoded.reason), output=output)
            return
        at = now()
        verdict = self.policy.decoded(
            late=at - job.deadline, calibration=self.calibration.problem(job.calibration, at)
        )
        self.outcomes.decoded(job, verdict, decoded.fields)

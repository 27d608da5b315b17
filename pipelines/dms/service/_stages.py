"""The frame's path: camera → warp → model → decode → publish, one task per stage.

Stages are joined by slots holding at most one frame: live, latest-frame-wins (a frame replaced by
a newer one is dropped and counted); replaying, hand-off slots (each stage waits for the next).
Each stage takes what it works with explicitly and ends every frame through
:class:`~pipelines.dms.service._outcomes.FrameOutcomes`, judged by
:class:`~pipelines.dms.service._policy.FramePolicy`. Every wait made for a frame is bounded by its
staleness bound (:meth:`FrameJob.bound_scope`): a model run still in progress at the frame's
deadline goes on and publishes its output late, until the bound. When the camera ends, the stages
end in order — each closes the next slot once it has finished what it holds — so frames in flight are
finished (each bounded), not lost.
"""

from __future__ import annotations

import contextlib
import functools
import time

import anyio
import numpy as np

from aio_runtime import (
    BudgetExhausted,
    CameraTimeout,
    Completion,
    ModelTimeout,
    RuntimeFault,
    WorkerThread,
    deadline_scope,
    now,
    run_in_thread,
    wait_complete,
)

from ..backends.base import Inference
from ..backends.cpu import RunSuperseded
from ..config.kinds import Mode
from ..frames.frame import CABIN_CAMERAS, Frame
from ..model.warp import MODEL_INPUT_SIZE, Warper
from ._calibration import CalibrationState
from ._camera import Camera
from ._device import DeviceSession, ModelDevice
from ._faults import ServiceFaults
from ._job import UNBUDGETED, FrameJob, JobSlot
from ._outcomes import FrameOutcomes
from ._policy import STALE, FramePolicy
from .slots import HandoffSlot, LatestSlot, SlotClosed

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
    """The model's input image from each frame, on a worker thread of its own. A frame already
    past its staleness bound is published stale, unworked."""

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
        at = now()
        if at >= job.stale_at:  # nothing done for it could still be of use
            self.outcomes.invalid(job, self.policy.stale(at - job.start, at, "warped"))
            return False
        key = (frame.width, frame.height, frame.stride)
        warper = self.warpers.get(key)
        if warper is None:  # a geometry no cabin camera has: planned on first use
            warper = self.warpers[key] = Warper()
        try:
            with job.bound_scope():
                job.image = await run_in_thread(
                    functools.partial(_warp, warper, frame),
                    worker=worker,
                    awaited=f"warp of frame {frame.frame_id}",
                    error=CameraTimeout,
                )
        except BudgetExhausted as exc:
            self.outcomes.invalid(job, self.policy.over_budget(exc, now()))
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
    """The model on each warped frame, on the device's current session. A backend that runs back to
    back is handed each frame as soon as it is warped: its run waits on the runner's thread and
    starts the moment the run in progress returns, unless a newer frame replaces it first (dropped,
    counted); a run still in progress at its frame's staleness bound is cut there. Live, a frame that
    could not be published before its bound (judged from the recent frames' work from here to
    publication, their p95), or is past it already, is not started: dropped, counted; replaying, one
    past its bound is published stale, unrun. Otherwise one frame at a time (the accelerator): at the
    frame's staleness bound the frame is published stale and the device's run goes on until it ends
    (see :meth:`_device_run`). A run still in progress at its frame's deadline goes on either way,
    and its output is published late (and valid). With a recorded source (``camera``), a run
    holds the source's reads back while it runs, and, live and overloaded, a frame is not started
    while the source has no frame read ahead (:meth:`Camera.reads_behind`)."""

    def __init__(
        self,
        device: ModelDevice,
        calibration: CalibrationState,
        *,
        policy: FramePolicy,
        outcomes: FrameOutcomes,
        overlap: bool = True,
        camera: Camera | None = None,
    ) -> None:
        self.device = device
        self.camera = camera
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
                # Runs back to back keep a fast enough host's model busy; a host that cannot keep
                # up gains nothing by them but a queue: one at a time, each the newest frame.
                overlap = self.overlap and not self.policy.overloaded
                if session is not None and session.backend.runs_back_to_back and overlap:
                    runs.start_soon(self._step, job, session, outbox)
                else:
                    await self._step(job, session, outbox)
        outbox.close()

    async def _step(self, job: FrameJob, session: DeviceSession | None, outbox: JobSlot) -> None:
        at = now()
        camera = self.camera
        behind = self.policy.overloaded and camera is not None and camera.reads_behind()
        if session is not None and (behind or not self.policy.admits(at, job.stale_at)):
            self.outcomes.dropped("overload", job)  # live: it could not finish in time
            return
        if at >= job.stale_at:  # replaying, nothing is dropped: nothing done for it is of use
            self.outcomes.invalid(job, self.policy.stale(at - job.start, at, "run"))
            return
        job.handed = at
        with camera.gives_way.held() if camera is not None else contextlib.nullcontext():
            worked = await self._infer(job, session)
        if worked:
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
            if session.backend.runs_back_to_back:
                # A run still in progress at the deadline goes on, its output published late;
                # at the frame's staleness bound it is cut.
                with job.bound_scope():
                    inference: Inference | None = await session.backend.infer(job.image, vector)
            else:
                inference = await self._device_run(job, session, vector)
        except RunSuperseded:  # a newer frame took its place before it started
            self.outcomes.dropped("model", job)
            return False
        except BudgetExhausted as exc:
            self.outcomes.invalid(job, self.policy.over_budget(exc, now()))
            return False
        except RuntimeFault as exc:
            self._device_fault(job, session, exc)
            return False
        if inference is None:  # the frame ended stale while the device went on
            return False
        self.outcomes.stage_done(job, "model", time.perf_counter() - start)
        job.output, job.device_time = inference
        return True

    async def _device_run(
        self, job: FrameJob, session: DeviceSession, vector: np.ndarray
    ) -> Inference | None:
        """A run on a device that runs one at a time. The frame waits for its output until its
        staleness bound; there it is published stale, and the run goes on under the device's
        own bounds — the hang rule above all, which ends a run that makes no progress — until it
        ends: no run of a later frame could start before, and a device judged by runs cut short
        could not be judged at all. None: the frame has ended (stale)."""
        outcome: Completion[Inference] = Completion()
        image = job.image
        assert image is not None

        async def device_run() -> None:
            with deadline_scope(
                at=job.start + UNBUDGETED,
                started=job.start,
                name=f"the model's run of frame {job.frame.frame_id}",
                detached=True,
            ):
                try:
                    outcome.set_result(await session.backend.infer(image, vector))
                except Exception as exc:  # the run's outcome, for whoever waits for it
                    outcome.set_exception(exc)

        stale: BudgetExhausted | None = None
        async with anyio.create_task_group() as device:
            device.start_soon(device_run)
            try:
                with job.bound_scope():
                    await wait_complete(
                        outcome,
                        awaited="the model's run",
                        error=ModelTimeout,
                        timeout=UNBUDGETED,
                    )
            except BudgetExhausted as exc:
                stale = exc
            except Exception:  # the run's own failure: raised below, not as a group
                pass
        if stale is None:
            return await outcome.wait()
        self.outcomes.invalid(job, self.policy.over_budget(stale, now()))
        try:  # the run ended after the frame: its output is of no use, its failure still counts
            await outcome.wait()
        except RuntimeFault as exc:
            self._device_failed(session, exc)
        else:
            if job.handed is not None:  # how long the work took, for the frames to come
                self.policy.worked(now(), now() - job.handed)
        return None

    def _device_fault(self, job: FrameJob, session: DeviceSession, exc: RuntimeFault) -> None:
        if session.failing:  # the session is being replaced: this is a consequence
            why = self.device.why_unavailable(session)
            self.outcomes.invalid(job, self.policy.no_model(why))
            return
        verdict = self.policy.device_fault(exc)
        self.outcomes.invalid(job, verdict)
        session.fail(exc)

    def _device_failed(self, session: DeviceSession, exc: RuntimeFault) -> None:
        """The run of a frame that has ended already failed: the device's failure all the
        same, said at once on every sink (a status message: no frame's)."""
        if not session.failing:
            self.outcomes.status(self.policy.device_fault(exc))
            session.fail(exc)


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
        at = now()
        if job.handed is not None:
            self.policy.worked(at, at - job.handed)
        if not decoded.valid or decoded.fields is None:
            self.outcomes.invalid(job, self.policy.invalid_output(decoded.reason), output=output)
            return
        verdict = self.policy.decoded(
            at=at,
            deadline=job.deadline,
            stale_at=job.stale_at,
            calibration=self.calibration.problem(job.calibration, at),
        )
        if verdict.reason is not None and verdict.reason.kind == STALE:
            self.outcomes.invalid(job, verdict, output=output, at=at)  # of no use: no driver data
            return
        self.outcomes.decoded(job, verdict, decoded.fields, at=at)

"""The DMS service: camera -> warp -> model -> decode -> publish, under per-frame deadlines.

One anyio task per stage, joined by latest-frame-wins slots (at most one frame waits per stage;
a replaced frame is dropped and counted). CPU work runs off the loop thread (the warp and the model
in worker threads, or the model on the simulated accelerator). On the CPU the model stage hands
each warped frame to the runner at once: it waits on the runner's thread behind the run in
progress and starts the moment that returns — unless a newer frame replaces it first (dropped,
counted) — so the model's runs follow each other without a round trip through the event loop.
Each frame has a deadline — its start of frame plus ``budget`` — that bounds every wait made for
it. Every outcome is reported to the availability state machine (design C6) and published: a frame
ends as published valid, published invalid with a reason, or dropped and counted (C7).

Availability: a hardware timeout or fault, a lost device, an accelerator that makes no progress
for ``gpu_hang_after``, a model that cannot run, a camera that stops → UNAVAILABLE with the reason,
at once. Stale or missing calibration, a frame over its budget, an isolated invalid output →
DEGRADED; ``unavailable_after`` frames in a row without a valid output → UNAVAILABLE. Back to
AVAILABLE after ``recover_after`` good frames in a row. The accelerator session is restarted by its
own task with exponential backoff, for as long as the service runs. Reasons are written
``"<kind>: <detail>"``; while a cause lasts, the availability keeps its first wording (one
transition per cause, not one per frame).

Every default lives in :class:`ServiceConfig` (and the CLI sets each).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from aio_runtime import (
    Availability,
    AvailabilityMachine,
    Backoff,
    BudgetExhausted,
    CameraTimeout,
    HardwareTimeout,
    ModelTimeout,
    Readiness,
    ReadinessLayer,
    RuntimeFault,
    Supervisor,
    WorkerThread,
    deadline_scope,
    get_logger,
    now,
    run_in_thread,
    wait_complete,
)
from transports.gpu import SessionConfig
from transports.sim import FaultPlan, FaultRule

from .accelerator import SimAccelerator, simulated_device
from .camera import CABIN_CAMERAS, Frame
from .camera_sources import SyntheticCalibration, SyntheticCamera, clock_ns
from .channels import FrameAccounting, LatestSlot, SlotClosed, reason_kind
from .decode import Decoder
from .endpoints import HealthState, Metrics, create_app, serve
from .faults import parse_faults
from .messages import READINESS_LAYERS, DriverStateV2
from .model import load_contract
from .model_runner import OnnxRunner, RunSuperseded
from .publish import JsonLinesSink, Sink, Subscriptions, ZmqSink
from .reference_model import reference_model_path
from .warp import MODEL_INPUT_SIZE, Warper

__all__ = ["DmsService", "ServiceConfig", "Summary"]

FRAME_AGES_KEPT = 100_000
"""Frame ages kept for the summary's percentiles: the latest ~80 minutes at 20 Hz."""
_log = get_logger("pipelines.dms")
_LAYER_NAMES = dict(zip([layer.label for layer in ReadinessLayer], READINESS_LAYERS, strict=True))


@dataclass
class ServiceConfig:
    """Every default of the service, in one place."""

    camera: str = "synthetic"
    """``synthetic``, a video file, or a recording (replayed)."""
    model: Path | None = None
    """An ONNX model with openpilot's DMS contract; None: the bundled (untrained) reference."""
    device: str = "sim"
    """``sim``: the model on the simulated accelerator; ``cpu``: onnxruntime on the CPU."""
    budget: float = 0.050
    """Seconds from start of frame to publication (one frame period at 20 Hz)."""
    recover_after: int = 3
    """Good frames in a row before the service is AVAILABLE again."""
    unavailable_after: int = 10
    """Frames in a row without a valid output (each only DEGRADED) before the service is
    UNAVAILABLE: DEGRADED is for isolated failures."""
    gpu_hang_after: float = 0.1
    """Seconds the accelerator may hold a kernel without completing it before it counts as hung
    (UNAVAILABLE, session restarted). A frame that runs out of budget while the accelerator still
    makes progress is late (DEGRADED), not a reason to restart it."""
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    calib: tuple[float, float, float] | None = None
    """A static calibration (roll, pitch, yaw); None: the synthetic calibration stream."""
    calib_stale_after: float = 2.5
    """Seconds after which calibration is stale (openpilot's rule for a 4 Hz stream)."""
    camera_stall_after: float = 0.25
    """Seconds without a frame before the camera counts as stalled."""
    health_host: str = "127.0.0.1"
    health_port: int | None = 9032
    """None: no HTTP endpoints; 0: any free port."""
    zmq: str | None = None
    jsonl: str | None = None
    raw_predictions: bool = False
    frames: int | None = None
    duration: float | None = None
    faults: str = ""
    intra_op_threads: int = 1
    model_cpus: tuple[int, ...] | None = None
    """CPUs for the model's thread (onnxruntime on the CPU); the event loop and the warp then keep
    off them. Without it, a model run woken by the loop tends to be placed on the loop's own CPU
    (the scheduler's wake-up placement) and hold the loop off it for milliseconds. None: no
    placement. Linux only."""
    model_load_timeout: float = 10.0
    device_open_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.device not in ("sim", "cpu"):
            raise ValueError(f"device must be 'sim' or 'cpu', got {self.device!r}")
        if not (0 < self.budget <= 10):
            raise ValueError(f"budget must be in (0, 10] seconds, got {self.budget}")
        if self.recover_after < 1 or self.unavailable_after < 1:
            raise ValueError(
                "recover_after and unavailable_after must be at least 1 frame, got "
                f"{self.recover_after} and {self.unavailable_after}"
            )
        if not (0 < self.gpu_hang_after <= 60):
            raise ValueError(
                f"gpu_hang_after must be in (0, 60] seconds, got {self.gpu_hang_after}"
            )
        if self.camera != "synthetic" and not Path(self.camera).is_file():
            raise ValueError(
                f"camera {self.camera!r}: no such file (expected 'synthetic', a video file or a "
                "recording)"
            )
        if self.calib is not None:
            _check_calib(self.calib)
        if self.model_cpus is not None:
            if not hasattr(os, "sched_getaffinity"):
                raise ValueError("model_cpus needs CPU placement, which only Linux offers here")
            available = os.sched_getaffinity(0)
            if not self.model_cpus or not set(self.model_cpus) <= available:
                raise ValueError(
                    f"model_cpus must be some of the CPUs this process may use "
                    f"({sorted(available)}), got {list(self.model_cpus)}"
                )
            if not available - set(self.model_cpus):
                raise ValueError(
                    f"model_cpus {list(self.model_cpus)} leaves no CPU for the event loop"
                )
        specs = parse_faults(self.faults)
        if self.device == "cpu" and any(spec.device is not None for spec in specs):
            raise ValueError("accelerator faults need --device sim")


def _check_calib(calib: Any) -> np.ndarray:
    values = np.asarray(calib, dtype=np.float64).reshape(-1)
    if values.size != 3 or not np.isfinite(values).all():
        raise ValueError(f"calibration must be 3 finite numbers (roll, pitch, yaw), got {calib!r}")
    return values.astype(np.float32).reshape(1, 3)


@dataclass
class Summary:
    frames: FrameAccounting
    frame_ages: deque[float] = field(default_factory=lambda: deque(maxlen=FRAME_AGES_KEPT))
    """The latest frames' ages (bounded: a service runs for days)."""
    transitions: list[tuple[float, str]] = field(default_factory=list)
    camera_error: str | None = None
    """Why the camera source failed, if it did (the service then ended)."""

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.frame_ages, q) * 1000) if self.frame_ages else math.nan


@dataclass
class _Job:
    frame: Frame
    number: int
    deadline: float
    image: np.ndarray | None = None

    @property
    def start(self) -> float:
        """Its start of frame, on the loop clock: where its budget begins."""
        return self.frame.timestamp_sof / 1e9

    calib: tuple[np.ndarray, float] | None = None
    output: np.ndarray | None = None
    gpu_time: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)


class DmsService:
    """``async with DmsService(config) as service:`` runs it; ``service.messages()`` and
    ``service.transitions()`` follow it; ``await service.finished()`` waits for the end (frames
    or duration reached)."""

    def __init__(
        self, config: ServiceConfig | None = None, *, source: Any = None, calibration: Any = None
    ) -> None:
        """``source``: a frame source instead of ``config.camera``; ``calibration``: an async
        iterable of calibration samples instead of the synthetic stream (with no static
        ``config.calib``)."""
        self.config = config or ServiceConfig()
        self._source = source
        self._calibration_source = calibration
        self.availability = AvailabilityMachine(
            recover_after=self.config.recover_after, initial_reason="starting"
        )
        self.readiness = Readiness()
        self.metrics = Metrics()
        self.subscriptions = Subscriptions()
        self.summary = Summary(FrameAccounting())
        self._faults = parse_faults(self.config.faults)
        self._sinks: list[Sink] = [self.subscriptions]
        self._calib: tuple[np.ndarray, float] | None = None
        self._seq = 0
        self._frame_arrived = anyio.Event()
        self._model_ready = anyio.Event()
        """Set once a model (or the accelerator) first can run frames, or opening it failed."""
        self._device_failed = anyio.Event()
        self._model: Any = None  # an OnnxRunner or a SimAccelerator, when ready
        self._decoder = Decoder({})
        """Set once the model's contract is read."""
        self._device_state = "loading the model"
        """Why there is no model to run, while there is none."""
        self._runners: list[OnnxRunner] = []
        self._calib_rejected = ""
        """Why the latest calibration sample was refused (non-finite), while it is the latest."""
        self._last_outcome = (False, False)
        """The last frame's task complete / output valid, for the health endpoints."""
        self._last_sof: int | None = None
        """The newest frame's start of frame (ns)."""
        self._other_cpus: frozenset[int] | None = None
        """The CPUs the loop and the warp keep to, when the model has CPUs of its own."""
        self._jobs: dict[int, _Job] = {}
        """Frames received and not yet published or dropped, by number."""
        self._without_output = 0
        """Frames in a row that produced no valid output."""
        self.health_port: int | None = None
        self._plan: FaultPlan | None = None
        self._done = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> DmsService:
        cfg = self.config
        if cfg.zmq:
            self._sinks.append(ZmqSink(cfg.zmq))
        if cfg.jsonl:
            self._sinks.append(JsonLinesSink(cfg.jsonl))
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(*exc_info)
        finally:
            for sink in self._sinks:
                sink.close()

    async def finished(self) -> Summary:
        await self._done.wait()
        return self.summary

    def messages(self, backlog: int = 64) -> AsyncIterator[DriverStateV2]:
        return self.subscriptions.subscribe(backlog=backlog)

    @contextlib.contextmanager
    def transitions(self) -> Iterator[Any]:
        with self.availability.subscribe() as stream:
            yield stream

    def health(self) -> HealthState:
        """Availability, and the readiness layers: the device's, then whether the last frame's
        task completed and its output was valid."""
        state = self.availability.state
        return HealthState(state.availability.value, state.reason, self._layers())

    # -- the pipeline --------------------------------------------------------------------------

    async def _run(self) -> None:
        cfg = self.config
        warp_slot: LatestSlot[_Job] = LatestSlot("warp", lambda job: self._drop("warp", job))
        model_slot: LatestSlot[_Job] = LatestSlot("model", lambda job: self._drop("model", job))
        decode_slot: LatestSlot[_Job] = LatestSlot("decode", lambda job: self._drop("decode", job))
        loop_cpus: set[int] = set()
        if cfg.model_cpus is not None:
            loop_cpus = os.sched_getaffinity(0)  # this thread's: it runs the event loop
            self._other_cpus = frozenset(loop_cpus - set(cfg.model_cpus)) or None
            if self._other_cpus is not None:
                os.sched_setaffinity(0, self._other_cpus)
        try:
            async with anyio.create_task_group() as services:
                services.start_soon(self._follow_availability)
                if cfg.health_port is not None:
                    app = create_app(self.health, self.metrics)
                    self.health_port = await services.start(
                        _serve_health, app, cfg.health_host, cfg.health_port
                    )
                services.start_soon(self._calibration)
                services.start_soon(self._device)
                # The stages end in order once the camera does: each closes the next slot, so
                # the frames in flight are finished (each bounded by its deadline), not lost.
                # One warper per geometry, the cabin cameras' planned before the first frame: a
                # resolution change mid-stream then costs no frame its budget.
                warpers = await run_in_thread(
                    _plan_warps, awaited="warp plans", error=CameraTimeout, timeout=10.0
                )
                # Frames are wanted once there is a model to run them (a recording replayed from
                # its start loses none to the model loading); a model that takes too long to
                # come up does not hold the camera back: its frames say so.
                with anyio.move_on_after(cfg.model_load_timeout + cfg.device_open_timeout):
                    await self._model_ready.wait()
                services.start_soon(self._camera_watchdog)
                async with anyio.create_task_group() as stages:
                    stages.start_soon(self._warp_stage, warp_slot, model_slot, warpers)
                    stages.start_soon(self._model_stage, model_slot, decode_slot)
                    stages.start_soon(self._decode_stage, decode_slot)
                    await self._camera_stage(warp_slot)
                services.cancel_scope.cancel()
        finally:
            # Frames still waiting or being worked on when the service stops are dropped,
            # counted: never lost.
            for job in list(self._jobs.values()):
                self._drop("shutdown", job)
            for runner in self._runners:
                runner.close()
            if self._other_cpus is not None:
                os.sched_setaffinity(0, loop_cpus)
            self._done.set()

    def _drop(self, stage: str, job: _Job) -> None:
        if self._jobs.pop(job.number, None) is None:
            return  # already ended
        self.summary.frames.drop(stage)
        self.metrics.frames_dropped.labels(stage=stage).inc()

    async def _camera_stage(self, warp_slot: LatestSlot[_Job]) -> None:
        try:
            source = self._source if self._source is not None else self._open_camera()
            await self._frames_from(source, warp_slot)
        except Exception as exc:  # a source that fails ends the stream, reported, not a crash
            _log.error("camera failed", error=repr(exc))
            self.summary.camera_error = f"{type(exc).__name__}: {exc}"
            self.availability.report_unavailable(f"camera: {self.summary.camera_error}")
        warp_slot.close()

    async def _frames_from(self, source: Any, warp_slot: LatestSlot[_Job]) -> None:
        cfg = self.config
        started = now()
        number = 0
        async with _closing(source):
            async for frame in source:
                if cfg.frames is not None and number >= cfg.frames:
                    break
                if cfg.duration is not None and now() - started >= cfg.duration:
                    break
                self._apply_faults(number)
                if any(f.name == "camera-stall" and f.active(number) for f in self._faults):
                    number += 1  # the camera delivers nothing while stalled
                    continue
                self._frame_arrived.set()
                self._last_sof = frame.timestamp_sof
                self.summary.frames.receive()
                job = _Job(frame, number, frame.timestamp_sof / 1e9 + cfg.budget)
                self._jobs[number] = job
                self.metrics.frames_in.inc()
                warp_slot.put(job)
                number += 1

    def _open_camera(self) -> Any:
        cfg = self.config
        if cfg.camera == "synthetic":
            return SyntheticCamera()
        path = Path(cfg.camera)
        if not path.exists():
            raise FileNotFoundError(f"camera {cfg.camera!r}: no such file (or use 'synthetic')")
        from .camera_replay import FILE_MAGIC, ReplayCamera
        from .camera_video import VideoFileCamera

        with path.open("rb") as f:
            magic = f.read(len(FILE_MAGIC))
        return ReplayCamera(path) if magic == FILE_MAGIC else VideoFileCamera(path)

    def _apply_faults(self, number: int) -> None:
        plan = self._plan
        if plan is None:
            return
        for spec in self._faults:
            fault = spec.device
            if fault is None:
                continue
            if number == spec.start:
                plan.add(FaultRule(fault, at=1, count=math.inf))
                _log.warning("fault injected", fault=spec.name, frame=number)
            elif number == spec.start + spec.frames:
                plan.clear(fault)
                _log.info("fault cleared", fault=spec.name, frame=number)

    async def _camera_watchdog(self) -> None:
        """A camera that stops delivering makes the service UNAVAILABLE (it never goes silent)."""
        while True:
            try:
                await wait_complete(
                    self._frame_arrived,
                    awaited="a camera frame",
                    error=CameraTimeout,
                    timeout=self.config.camera_stall_after,
                )
                self._frame_arrived = anyio.Event()
            except CameraTimeout as exc:  # reported again each period while the camera is out
                self.metrics.timeouts.labels(layer=str(exc.layer)).inc()
                self._unavailable(f"camera: {exc.message}")
                self._publish_status(f"camera: {exc.message}")

    async def _warp_stage(
        self,
        inbox: LatestSlot[_Job],
        outbox: LatestSlot[_Job],
        warpers: dict[tuple[int, int, int], Warper],
    ) -> None:
        worker = WorkerThread("warp", cpus=self._other_cpus)
        try:
            await self._warp_frames(inbox, outbox, warpers, worker)
        finally:
            worker.close()

    async def _warp_frames(
        self,
        inbox: LatestSlot[_Job],
        outbox: LatestSlot[_Job],
        warpers: dict[tuple[int, int, int], Warper],
        worker: WorkerThread,
    ) -> None:
        while True:
            try:
                job = await inbox.get()
            except SlotClosed:
                outbox.close()
                return
            start = time.perf_counter()
            frame = job.frame
            if now() >= job.deadline:  # stale: nothing done for it could still be on time
                self.metrics.timeouts.labels(layer="frame-budget").inc()
                self._publish_invalid(
                    job,
                    f"frame budget: the frame was {(now() - job.start) * 1e3:.1f} ms old when it "
                    f"could be warped (budget {self.config.budget * 1e3:g} ms)",
                    degraded=True,
                )
                continue
            key = (frame.width, frame.height, frame.stride)
            warper = warpers.get(key)
            if warper is None:  # a geometry no cabin camera has: planned on first use
                warper = warpers[key] = Warper()
            try:
                with deadline_scope(
                    at=job.deadline, started=job.start, name=f"frame {frame.frame_id}"
                ):
                    job.image = await run_in_thread(
                        functools.partial(_warp, warper, frame),
                        worker=worker,
                        awaited=f"warp of frame {frame.frame_id}",
                        error=CameraTimeout,
                    )
            except BudgetExhausted as exc:
                self.metrics.timeouts.labels(layer="frame-budget").inc()
                self._publish_invalid(job, f"frame budget: {exc.message}", degraded=True)
                continue
            except (RuntimeFault, ValueError) as exc:
                self._publish_invalid(job, f"warp: {exc}", degraded=True)
                continue
            job.stages["warp"] = time.perf_counter() - start
            self.metrics.stage_latency.labels(stage="warp").observe(job.stages["warp"])
            outbox.put(job)

    async def _model_stage(self, inbox: LatestSlot[_Job], outbox: LatestSlot[_Job]) -> None:
        """On the CPU a frame's run is handed to the runner as soon as the frame is warped: it
        waits on the runner's thread and starts the moment the run in progress returns, unless a
        newer frame replaces it first (dropped, counted). The accelerator takes one frame at a
        time."""
        async with anyio.create_task_group() as runs:
            while True:
                try:
                    job = await inbox.get()
                except SlotClosed:
                    break
                if self.config.device == "cpu":
                    runs.start_soon(self._model_step, job, outbox)
                else:
                    await self._model_step(job, outbox)
        outbox.close()

    async def _model_step(self, job: _Job, outbox: LatestSlot[_Job]) -> None:
        if await self._infer(job):
            outbox.put(job)  # decoding and publishing it overlaps the next run

    async def _decode_stage(self, inbox: LatestSlot[_Job]) -> None:
        while True:
            try:
                job = await inbox.get()
            except SlotClosed:
                return
            self._finish(job)

    async def _infer(self, job: _Job) -> bool:
        """Run the model on the job; True with ``job.output`` set, False once it was published
        invalid."""
        frame, cfg = job.frame, self.config
        calib = self._calib
        if calib is not None and not np.isfinite(calib[0]).all():
            calib = None
        model = self._model
        if model is None:  # the accelerator's supervisor reports the availability meanwhile
            self._publish_invalid(job, f"model unavailable: {self._device_state}", report=False)
            return False
        # This session's failure signal: a failure seen after a restart began must not restart
        # the next session.
        failed = self._device_failed
        job.calib = calib
        start = time.perf_counter()
        vector = calib[0] if calib is not None else np.zeros((1, 3), np.float32)
        assert job.image is not None
        try:
            with deadline_scope(at=job.deadline, started=job.start, name=f"frame {frame.frame_id}"):
                if isinstance(model, OnnxRunner):  # bounded by the frame's deadline alone
                    output = await model.run(
                        job.image, vector, handed_over=True, replace_waiting=True
                    )
                    gpu_time = time.perf_counter() - start
                else:
                    result, phases = await model.run(job.image, vector, timeout=cfg.gpu_hang_after)
                    output, gpu_time = result.reshape(-1), phases.device
        except RunSuperseded:  # a newer frame took its place before it started
            self._drop("model", job)
            return False
        except BudgetExhausted as exc:
            await self._overran(job, model, exc, failed)
            return False
        except (HardwareTimeout, RuntimeFault) as exc:
            self._device_fault(job, exc, failed)
            return False
        job.stages["model"] = time.perf_counter() - start
        self.metrics.stage_latency.labels(stage="model").observe(job.stages["model"])
        job.output, job.gpu_time = output, gpu_time
        return True

    async def _overran(
        self, job: _Job, model: Any, exc: BudgetExhausted, failed: anyio.Event
    ) -> None:
        """The frame ran out of budget waiting for the model: late (DEGRADED) — unless the
        accelerator has made no progress for ``gpu_hang_after``: hung (UNAVAILABLE, restarted)."""
        cfg = self.config
        self.metrics.timeouts.labels(layer="frame-budget").inc()
        if isinstance(model, SimAccelerator) and not failed.is_set():
            try:
                stalled = await model.stalled_for(timeout=cfg.budget)
            except RuntimeFault as probe_error:  # the device could not even be read
                self._device_fault(job, probe_error, failed)
                return
            if stalled >= cfg.gpu_hang_after:
                self.metrics.timeouts.labels(layer=str(exc.layer)).inc()
                self._publish_invalid(
                    job,
                    f"{exc.layer}: the accelerator has made no progress for {stalled:.3f} s "
                    f"(hung after {cfg.gpu_hang_after:g} s; {exc.message})",
                )
                failed.set()
                return
        self._publish_invalid(job, f"frame budget: {exc.message}", degraded=True)

    def _device_fault(self, job: _Job, exc: RuntimeFault, failed: anyio.Event) -> None:
        """A hardware timeout or fault from the model's device: UNAVAILABLE, session restarted."""
        if failed.is_set():  # the session was already failing: this is a consequence
            self._publish_invalid(job, f"model unavailable: {self._device_state}", report=False)
            return
        self.metrics.timeouts.labels(layer=str(exc.layer)).inc()
        self._publish_invalid(job, f"{exc.layer}: {exc.message}")
        if self.config.device == "sim":
            failed.set()

    def _finish(self, job: _Job) -> None:
        """Decode the job's output, report it and publish it."""
        cfg, output, calib = self.config, job.output, job.calib
        assert output is not None
        if any(f.name == "nan-output" and f.active(job.number) for f in self._faults):
            output = np.full_like(output, np.nan)
        decoded = self._decoder(output)
        if not decoded.valid:
            self._publish_invalid(
                job, f"invalid output: {decoded.reason}", degraded=True, output=output
            )
            return
        self._without_output = 0
        late = now() - job.deadline
        if calib is None or now() - calib[1] > cfg.calib_stale_after:
            reason = self._calib_rejected or "calibration missing or stale"
        elif late > 0:
            reason = f"frame budget: decoded {late * 1e3:.1f} ms after the frame's deadline"
        else:
            reason = ""
        if reason:
            self._degrade(reason)
        else:
            self.availability.report_good()
            state = self.availability.state
            if state.availability is not Availability.AVAILABLE:  # good frames, not enough yet
                reason = f"recovering: {state.availability.value} ({state.reason})"
        self._publish(
            job,
            valid=not reason,
            reason=reason,
            fields=decoded.fields,
            output=output,
            model_time=sum(job.stages.values()),
            gpu_time=job.gpu_time,
        )

    def _publish_invalid(
        self,
        job: _Job,
        reason: str,
        *,
        degraded: bool = False,
        output: np.ndarray | None = None,
        report: bool = True,
    ) -> None:
        """Publish the frame invalid with ``reason`` and report it to the availability (unless
        ``report`` is false: someone else reports the cause)."""
        self._without_output += 1
        if degraded and self._without_output < self.config.unavailable_after:
            self._degrade(reason)  # an isolated failure
        elif report:
            if degraded:  # not isolated any more: nothing trustworthy comes out
                reason = f"no valid output: {self._without_output} frames in a row; {reason}"
            self._unavailable(reason)
        self._publish(job, valid=False, reason=reason, output=output)

    # Reasons are written "<kind>: <detail>". A frame's reason says what happened to it; the
    # availability keeps the first wording of a kind while the state holds (a second fault of
    # the same kind meanwhile shows under the first's wording), so a cause that lasts is one
    # transition, not one per frame.

    def _degrade(self, reason: str) -> None:
        self.availability.report_degraded(self._same_kind(Availability.DEGRADED, reason))

    def _unavailable(self, reason: str) -> None:
        self.availability.report_unavailable(self._same_kind(Availability.UNAVAILABLE, reason))

    def _same_kind(self, availability: Availability, reason: str) -> str:
        state = self.availability.state
        if state.availability is availability and reason_kind(state.reason or "") == reason_kind(
            reason
        ):
            return state.reason or reason
        return reason

    def _publish(
        self,
        job: _Job,
        *,
        valid: bool,
        reason: str,
        fields: Any = None,
        output: np.ndarray | None = None,
        model_time: float = 0.0,
        gpu_time: float = 0.0,
    ) -> None:
        frame = job.frame
        age = max(0.0, clock_ns() / 1e9 - frame.timestamp_sof / 1e9)
        self._last_outcome = (output is not None or fields is not None, fields is not None)
        message = DriverStateV2(
            seq=self._seq,
            frame_id=frame.frame_id,
            timestamp_sof=frame.timestamp_sof,
            timestamp_eof=frame.timestamp_eof,
            frame_age=age,
            availability=self.availability.state.availability.value,
            reason=reason,
            valid=valid and fields is not None,
            readiness=self._layers(),
            model_execution_time=model_time,
            gpu_execution_time=gpu_time,
            wheel_on_right_prob=None if fields is None else fields.wheel_on_right_prob,
            left_driver_data=None if fields is None else fields.left_driver_data.to_dict(),
            right_driver_data=None if fields is None else fields.right_driver_data.to_dict(),
            raw_predictions=(
                output.astype("<f4").tobytes()
                if output is not None and self.config.raw_predictions
                else None
            ),
            recorded_sof=frame.recorded_sof,
            recorded_eof=frame.recorded_eof,
        )
        self._jobs.pop(job.number, None)
        self._send(message)
        self.summary.frames.published(message.valid, message.reason)
        self.summary.frame_ages.append(age)
        self.metrics.frames_published.labels(valid=str(message.valid).lower()).inc()
        self.metrics.end_to_end.observe(age)

    def _publish_status(self, reason: str) -> None:
        """A message for no frame (``frameId`` -1, no timestamps; ``frameAge``: the age of the
        newest frame, 0 if none came): published while frames do not arrive, so a consumer on
        every sink hears of it instead of silence."""
        last = self._last_sof
        age = 0.0 if last is None else max(0.0, clock_ns() / 1e9 - last / 1e9)
        self._last_outcome = (False, False)
        self._send(
            DriverStateV2(
                seq=self._seq,
                frame_id=-1,
                timestamp_sof=0,
                timestamp_eof=0,
                frame_age=age,
                availability=self.availability.state.availability.value,
                reason=reason,
                valid=False,
                readiness=self._layers(),
            )
        )

    def _layers(self) -> dict[str, bool]:
        layers = {_LAYER_NAMES[k]: v for k, v in self.readiness.snapshot().items()}
        layers["taskComplete"], layers["outputValid"] = self._last_outcome
        return layers

    def _send(self, message: DriverStateV2) -> None:
        self._seq += 1
        for sink in self._sinks:
            sink.publish(message)

    # -- calibration, device, availability -----------------------------------------------------

    async def _calibration(self) -> None:
        cfg = self.config
        if cfg.calib is not None:
            self._calib = (_check_calib(cfg.calib), math.inf)  # static: never stale
            return
        stream = self._calibration_source or SyntheticCalibration()
        async with _closing(stream):
            async for sample in stream:
                values = np.asarray(sample.rpy, dtype=np.float64).reshape(1, 3)
                if not np.isfinite(values).all():  # rejected: the last good one ages instead
                    self._calib_rejected = f"calibration rejected: {values.ravel().tolist()}"
                    continue
                self._calib_rejected = ""
                self._calib = (values.astype(np.float32), sample.timestamp_ns / 1e9)

    async def _device(self) -> None:
        """Open the model (and the accelerator); reopen it with backoff whenever it fails."""
        cfg = self.config

        def load() -> tuple[Path, Any]:
            path = cfg.model if cfg.model is not None else reference_model_path()
            return path, load_contract(path)

        path, contract = await run_in_thread(
            load, awaited="the model's contract", error=ModelTimeout, timeout=cfg.model_load_timeout
        )
        self._decoder = Decoder(contract.output_slices)
        if cfg.device == "cpu":
            runner = await OnnxRunner.open(
                path,
                timeout=cfg.model_load_timeout,
                intra_op_threads=cfg.intra_op_threads,
                cpus=cfg.model_cpus,
            )
            self._runners.append(runner)
            self._model = runner
            self._model_ready.set()
            for layer in (ReadinessLayer.DEVICE_ONLINE, ReadinessLayer.FIRMWARE_READY):
                self.readiness.mark_up(layer)
            self.readiness.mark_up(ReadinessLayer.QUEUE_SUBMITTABLE)
            return
        # The simulated GPU runs the model as its kernel, on a thread of this process.
        kernel = OnnxRunner(path, intra_op_threads=cfg.intra_op_threads, contract=contract)
        self._runners.append(kernel)

        def infer(img: np.ndarray, calib: np.ndarray) -> np.ndarray:
            return kernel.run_blocking(img, calib)

        self._plan = FaultPlan()
        self._device_state = "opening the accelerator"
        session_config = SessionConfig(
            kernel_timeout=cfg.gpu_hang_after, fence_timeout=1.0, bulk_timeout=1.0
        )
        async with simulated_device(
            infer, image_size=MODEL_INPUT_SIZE, output_size=contract.output_length, plan=self._plan
        ) as device:

            @contextlib.asynccontextmanager
            async def open_session() -> AsyncIterator[SimAccelerator]:
                self._device_failed = anyio.Event()
                self.readiness = Readiness()
                try:
                    with deadline_scope(cfg.device_open_timeout, name="accelerator open"):
                        accelerator = await SimAccelerator.open(
                            device,
                            image_size=MODEL_INPUT_SIZE,
                            output_size=contract.output_length,
                            config=session_config,
                            readiness=self.readiness,
                        )
                except BaseException:
                    self._model_ready.set()  # none yet: frames flow, and say so
                    raise
                try:
                    yield accelerator
                finally:
                    self._model = None
                    self._device_state = (
                        f"the accelerator is restarting ({self.availability.state.reason})"
                    )
                    await accelerator.aclose()

            async def serve_frames(accelerator: SimAccelerator) -> None:
                self._model = accelerator
                self._model_ready.set()
                await self._device_failed.wait()
                raise RuntimeFault(f"the accelerator failed: {self.availability.state.reason}")

            await Supervisor(
                "accelerator",
                open_session,
                serve_frames,
                availability=self.availability,
                backoff=Backoff(initial=cfg.backoff_initial, cap=cfg.backoff_max),
                healthy_after=1.0,
            ).run()

    async def _follow_availability(self) -> None:
        with self.availability.subscribe() as stream:
            async for transition in stream:
                current = transition.current
                self.metrics.set_availability(current.availability.value)
                self.summary.transitions.append((current.since, str(current)))
                _log.info("availability", state=str(current))


async def _serve_health(
    app: Any,
    host: str,
    port: int,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    await serve(app, host=host, port=port, task_status=task_status)


def _closing(source: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """Close a source that can be closed when the block ends; leave a plain iterable be."""
    return contextlib.aclosing(source) if hasattr(source, "aclose") else contextlib.nullcontext()


def _plan_warps() -> dict[tuple[int, int, int], Warper]:
    warpers = {}
    for camera in CABIN_CAMERAS:
        key = (camera.width, camera.height, camera.layout.stride)
        warpers[key] = Warper()
        warpers[key].plan_for(*key)
    return warpers


def _warp(warper: Warper, frame: Frame) -> np.ndarray:
    """On a worker thread: the frame's luma, warped into a fresh array (the next frame must not
    overwrite what the model is reading)."""
    out = np.empty((1, MODEL_INPUT_SIZE), np.uint8)
    return warper.warp(frame.buffer, frame.width, frame.height, frame.stride, out=out)

"""The DMS service: camera -> warp -> model -> decode -> publish, under per-frame deadlines.

One anyio task per stage, joined by latest-frame-wins slots (at most one frame waits per stage;
a replaced frame is dropped and counted). CPU work runs off the loop thread (the warp and the model
in worker threads, or the model on the accelerator). Each frame has a deadline — its start of
frame plus ``budget`` — that bounds every wait made for it. Every frame ends as published valid,
published invalid with a reason, or dropped and counted (C7); every outcome is reported to the
service's availability (C6).

The parts, each owning one thing: the frame's path (``_stages``), how frames end (``_outcomes``),
what each result means for availability (``_policy``), the model's device and its supervised
sessions (``_device``, on the backends of ``_backends``), calibration (``_calibration``), scripted
faults (``_faults``), CPU placement (``_platform``). Every default lives in
:class:`~pipelines.dms.config.ServiceConfig`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from types import TracebackType

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from aio_runtime import CameraTimeout, Transition, run_in_thread
from transports.sim import FaultPlan

from ..camera import Frame
from ..camera_sources import CalibrationSample, open_camera
from ..camera_synthetic import SyntheticCalibration
from ..config import ServiceConfig
from ..endpoints import HealthState, Metrics, create_app, serve
from ..messages import DriverStateV2, readiness_record
from ..publish import JsonLinesSink, Sink, Subscriptions, ZmqSink
from ._backends import TransportOpener
from ._calibration import CalibrationState
from ._device import ModelDevice
from ._faults import ServiceFaults
from ._outcomes import FrameOutcomes, Summary
from ._platform import loop_kept_off
from ._policy import FramePolicy
from ._stages import Camera, Decode, Model, Warp, plan_warps, run_stages

__all__ = ["DmsService", "Summary"]


class DmsService:
    """``async with DmsService(config) as service:`` runs it; ``service.messages()`` and
    ``service.transitions()`` follow it; ``await service.finished()`` waits for the end (frames
    or duration reached, or the camera's end).

    ``source``: frames from this source instead of ``config.camera``; ``calibration``: samples
    from this stream instead of the synthetic one (with no static ``config.calib``);
    ``transport``: how to reach the accelerator (``--device sim``) instead of simulating one in
    this process — each call opens a fresh USB transport for one session.
    """

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        source: AsyncIterable[Frame] | None = None,
        calibration: AsyncIterable[CalibrationSample] | None = None,
        transport: TransportOpener | None = None,
    ) -> None:
        self.config = cfg = config or ServiceConfig()
        self._source = source
        self._calibration = calibration
        self.policy = FramePolicy(
            budget=cfg.budget,
            gpu_hang_after=cfg.gpu_hang_after,
            recover_after=cfg.recover_after,
            unavailable_after=cfg.unavailable_after,
        )
        self.availability = self.policy.availability
        self.metrics = Metrics()
        self.subscriptions = Subscriptions()
        self._sinks: list[Sink] = [self.subscriptions]
        self._plan = FaultPlan()
        self.device = ModelDevice(cfg, self.availability, plan=self._plan, transport=transport)
        self.outcomes = FrameOutcomes(
            availability=self.availability,
            metrics=self.metrics,
            sinks=self._sinks,
            readiness=lambda: self.device.readiness,
            raw_predictions=cfg.raw_predictions,
        )
        self.health_port: int | None = None
        self._done = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def summary(self) -> Summary:
        return self.outcomes.summary

    async def __aenter__(self) -> DmsService:
        cfg = self.config
        cfg.check_environment()
        if cfg.zmq:
            self._sinks.append(ZmqSink(cfg.zmq))
        if cfg.jsonl:
            self._sinks.append(JsonLinesSink(cfg.jsonl))
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            for sink in self._sinks:
                sink.close()

    async def finished(self) -> Summary:
        await self._done.wait()
        return self.summary

    def messages(self, backlog: int = 64) -> AsyncIterator[DriverStateV2]:
        return self.subscriptions.subscribe(backlog=backlog)

    @contextlib.contextmanager
    def transitions(self) -> Iterator[MemoryObjectReceiveStream[Transition]]:
        with self.availability.subscribe() as stream:
            yield stream

    def health(self) -> HealthState:
        """Availability, and the readiness layers: the device's, then whether the last frame's
        task completed and its output was valid."""
        state = self.availability.state
        return HealthState(
            state.availability, state.reason, readiness_record(self.device.readiness)
        )

    async def _run(self) -> None:
        cfg, outcomes, policy = self.config, self.outcomes, self.policy
        calibration = CalibrationState(stale_after=cfg.calib_stale_after, static=cfg.calib)
        faults = ServiceFaults(cfg.faults, self._plan)
        model_cpus = cfg.placed_cpus()
        try:
            with loop_kept_off(model_cpus) as loop_cpus:
                async with anyio.create_task_group() as services:
                    services.start_soon(outcomes.follow_availability)
                    if cfg.health_port is not None:
                        app = create_app(self.health, self.metrics)
                        self.health_port = await services.start(
                            functools.partial(
                                serve, app, host=cfg.health_host, port=cfg.health_port
                            )
                        )
                    if cfg.calib is None:
                        services.start_soon(
                            calibration.follow, self._calibration or SyntheticCalibration()
                        )
                    services.start_soon(self.device.serve, model_cpus)
                    # One warper per geometry, the cabin cameras' planned before the first frame:
                    # a resolution change mid-stream then costs no frame its budget.
                    warpers = await run_in_thread(
                        plan_warps,
                        awaited="warp plans",
                        error=CameraTimeout,
                        timeout=cfg.warp_plan_timeout,
                    )
                    # Frames are wanted once there is a model to run them (a recording replayed
                    # from its start loses none to the model loading); a model that takes too long
                    # to come up does not hold the camera back: its frames say so.
                    with anyio.move_on_after(cfg.model_load_timeout + cfg.device_open_timeout):
                        await self.device.ready.wait()
                    source = self._source
                    camera = Camera(
                        (lambda: source) if source is not None else lambda: open_camera(cfg.camera),
                        budget=cfg.budget,
                        frames=cfg.frames,
                        duration=cfg.duration,
                        faults=faults,
                        policy=policy,
                        outcomes=outcomes,
                    )
                    services.start_soon(camera.watch, cfg.camera_stall_after)
                    await run_stages(
                        camera,
                        Warp(warpers, cpus=loop_cpus, policy=policy, outcomes=outcomes),
                        Model(self.device, calibration, policy=policy, outcomes=outcomes),
                        Decode(
                            self.device,
                            calibration,
                            faults=faults,
                            policy=policy,
                            outcomes=outcomes,
                        ),
                        outcomes,
                    )
                    services.cancel_scope.cancel()
        finally:
            outcomes.drop_in_flight()  # frames in flight when the service stops: counted
            self._done.set()

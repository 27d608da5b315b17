"""The DMS service: camera -> warp -> model -> decode -> publish, under per-frame deadlines.

One anyio task per stage, joined by slots holding at most one frame: live, latest-frame-wins (a
replaced frame is dropped and counted); replaying, hand-off slots (each stage waits for the next:
nothing is dropped). CPU work runs off the loop thread (the warp and the model in worker threads,
or the model on the accelerator). Each frame has a deadline — its start of frame plus ``budget``:
a valid output published later is late — and a staleness bound — its start of frame plus
``stale_after`` — that bounds every wait made for it (replaying, both from when it is handed on;
with ``no_budget``, ``--no-budget``, a 30 s bound only a stopped stage meets). Every frame ends
as published valid, published invalid with a reason, or dropped and counted (C7); every outcome
is reported to the service's policy, which says the service's availability (C6, C13).

The parts, each owning one thing: the camera stage and its watchdog (``_camera``), a frame in
flight (``_job``) and the slots between stages (``slots``), the frame's path (``_stages``), how
frames end (``_outcomes``), what each result means (``_policy``, with the rate it keeps up with,
``_rate``, and the host's load that says why it cannot, ``_host``, which also places the model's
thread), the model's device and its supervised sessions (``_device``, on
:mod:`pipelines.dms.backends`), starting up (``_startup``), calibration (``_calibration``),
scripted faults (``_faults``), health over HTTP (``endpoints``) and the Prometheus series
(``metrics``). Every default lives in
:class:`~pipelines.dms.config.settings.ServiceConfig`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from contextlib import AbstractContextManager

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from aio_runtime import ExcInfo, Transition, realtime_threads

from ..backends.link import TransportOpener
from ..config.kinds import CameraFile, CameraSpec, Mode
from ..config.settings import ServiceConfig
from ..frames import calibration_kind, check_camera, open_first
from ..frames.frame import Frame
from ..frames.source import CLOSE_BOUND, CalibrationSample, FrameSource
from ..messages import DriverStateV2, readiness_record
from ..sinks import SINKS, Rows, open_sinks
from ..sinks.parquet import ROW_GROUP
from ._calibration import CalibrationState
from ._camera import Camera
from ._device import ModelDevice
from ._faults import ServiceFaults
from ._host import HostLoad, loop_kept_off
from ._outcomes import FrameOutcomes, Summary
from ._policy import FramePolicy
from ._stages import Decode, Model, Warp, Warpers, run_stages
from ._startup import (
    BoundEndpoints,
    StartupError,
    load_model,
    ready_for_frames,
    refused,
    serve_health,
    started_group,
)
from .endpoints import HealthState, create_app

__all__ = ["BoundEndpoints", "DmsService", "StartupError", "Summary"]


class DmsService:
    """``async with DmsService(config) as service:`` runs it (leaving the block stops it);
    ``await service.started()`` says where it listens; ``service.messages()`` and
    ``service.transitions()`` follow it; ``await service.finished()`` waits for the end (frames
    or duration reached, or the camera's end). Entering raises :class:`StartupError`, and only
    that, for a service that cannot start.

    ``source``: frames from this source instead of ``config.camera``; ``calibration``: samples
    from this stream instead of the synthetic one (with no static ``config.calib``);
    ``transport``: how to reach the accelerator (``--device sim``) instead of simulating one in
    this process — each call opens a fresh USB transport for one session; ``recording``,
    ``row_group``: the ``recording`` column of ``config.parquet``'s rows (default: the camera
    file's name) and the rows a row group of it holds (default 1024).
    """

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        source: AsyncIterable[Frame] | None = None,
        calibration: AsyncIterable[CalibrationSample] | None = None,
        transport: TransportOpener | None = None,
        recording: str | None = None,
        row_group: int = ROW_GROUP,
    ) -> None:
        self.config = cfg = config or ServiceConfig()
        self._rows = Rows(_name(cfg.camera) if recording is None else recording, row_group)
        self._source = source
        self._calibration_stream = calibration
        self._calibration = CalibrationState(stale_after=cfg.calib_stale_after, static=cfg.calib)
        self.policy = FramePolicy(
            budget=cfg.budget,
            stale_after=cfg.staleness,
            recover_after=cfg.recover_after,
            unavailable_after=cfg.unavailable_after,
            min_rate=cfg.min_rate,
            live=cfg.mode is Mode.LIVE,
            host=HostLoad().sample if cfg.mode is Mode.LIVE else None,
        )
        self.availability = self.policy.availability
        self.device = ModelDevice(cfg, self.availability, transport=transport)
        self._faults = ServiceFaults(cfg.faults, self.device.plan)
        self.outcomes = FrameOutcomes(
            self.policy,
            self.device,
            raw_predictions=cfg.raw_predictions,
            mode=cfg.mode,
            run_id=cfg.run_id,
        )
        self.metrics = self.outcomes.metrics
        self.health_port: int | None = None
        """The health endpoints' port, once bound (None: not yet, or off)."""
        self._started = anyio.Event()
        self._bound: BoundEndpoints | None = None
        self._start_failure: StartupError | None = None
        self._done = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._camera: Camera | None = None
        self._opened: FrameSource | None = None
        """The source of ``config.camera``, where its kind opens as the service starts (a route
        segment)."""

    @property
    def summary(self) -> Summary:
        return self.outcomes.summary

    @property
    def run_id(self) -> str:
        """The ``runId`` of every message this service publishes (``config.run_id``, or fresh)."""
        return self.outcomes.run_id

    @property
    def source_length(self) -> int | None:
        """How many frames the camera's file holds, where it says (None: a live camera)."""
        return self._camera.length if self._camera is not None else None

    async def __aenter__(self) -> DmsService:
        """Start: check the machine's side of the config (and open a route segment named as
        the camera: its log is read and matched to its video), open the sinks, bind the health
        port, load the model — then take frames. :class:`StartupError` for the first that
        fails."""
        try:
            await self._start_up()
        except StartupError as exc:
            self._start_failure = exc
            raise
        except BaseException:
            self._start_failure = StartupError("the service was stopped before it had started")
            raise
        finally:
            self._started.set()
        return self

    async def _start_up(self) -> None:
        cfg = self.config
        try:
            with refused():
                cfg.check_environment()
                for kind in SINKS:
                    kind.check_environment(cfg)
                if self._source is None:
                    check_camera(cfg.camera)
                    self._opened = await open_first(cfg.camera, paced=cfg.mode is Mode.LIVE)
            for kind in SINKS:
                with refused(kind.setting):
                    self.outcomes.add_sinks(open_sinks(kind, cfg, self._rows))
            self._tg = await started_group(self._run)
        except BaseException:  # the sinks opened so far (say, one before one that failed)
            with anyio.CancelScope(shield=True):  # bounded: each sink drains within its bound
                await self.outcomes.close_sinks()
            await self._close_opened()
            raise
        health = cfg.health_host if self.health_port is not None else None
        listening = (sink.endpoint() for sink in self.outcomes.sinks)
        self._bound = BoundEndpoints(
            health_host=health,
            health_port=self.health_port,
            sinks=tuple(where for where in listening if where is not None),
        )

    async def __aexit__(self, *exc_info: *ExcInfo) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(*exc_info)
        finally:
            with anyio.CancelScope(shield=True):  # bounded: each sink drains within its bound
                await self.outcomes.close_sinks()

    async def started(self) -> BoundEndpoints:
        """Where the service listens, once it has started (at once inside ``async with``; another
        task may wait for it). :class:`StartupError` if it could not start, or was stopped before
        it had."""
        await self._started.wait()
        if self._bound is None:
            failure = self._start_failure
            assert failure is not None
            raise StartupError(str(failure), setting=failure.setting) from failure
        return self._bound

    async def finished(self) -> Summary:
        """The summary, once the service has ended (by itself, or stopped). :class:`StartupError`
        if it could not start, or was stopped before it had (as :meth:`started`)."""
        await self.started()  # a service that never ran never ends
        await self._done.wait()
        return self.summary

    def messages(self, backlog: int | None = None) -> AsyncIterator[DriverStateV2]:
        """Every message from now on (``backlog``: how many may wait unread; by default the
        sink's, 200). Live, a reader that falls behind loses the oldest, counted; replaying, it
        holds the replay back (for at most the stall limit)."""
        return self.outcomes.subscriptions.subscribe(backlog=backlog)

    def transitions(self) -> AbstractContextManager[MemoryObjectReceiveStream[Transition]]:
        """``with service.transitions() as stream:``: every availability change, in order,
        starting with the current state."""
        return self.availability.subscribe()

    def health(self) -> HealthState:
        """Availability, and the readiness layers: the device's, then whether the last frame's
        task completed and its output was valid."""
        state, layers = self.availability.state, readiness_record(self.device.readiness)
        return HealthState(state.availability, state.reason, layers)

    async def _run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        cfg, outcomes, policy = self.config, self.outcomes, self.policy
        model_cpus = cfg.placed_cpus()
        try:
            with loop_kept_off(model_cpus) as loop_cpus, realtime_threads(cfg.realtime):
                async with anyio.create_task_group() as services:
                    warpers = await self._start(services, model_cpus)
                    task_status.started()
                    source = self._source if self._source is not None else self._opened
                    camera = self._camera = Camera(
                        cfg.camera if source is None else source,
                        limits=cfg,
                        faults=self._faults,
                        policy=policy,
                        outcomes=outcomes,
                    )
                    services.start_soon(camera.watch, cfg.camera_stall_after)
                    services.start_soon(self._stop_on_sink_failure, services.cancel_scope)
                    await run_stages(
                        camera,
                        Warp(warpers, cpus=loop_cpus, policy=policy, outcomes=outcomes),
                        Model(
                            self.device,
                            self._calibration,
                            policy=policy,
                            outcomes=outcomes,
                            overlap=cfg.mode is Mode.LIVE,
                            camera=camera,
                        ),
                        Decode(
                            self.device,
                            self._calibration,
                            faults=self._faults,
                            policy=policy,
                            outcomes=outcomes,
                        ),
                        outcomes,
                        cfg.mode,
                    )
                    outcomes.ended()
                    services.cancel_scope.cancel()
        finally:
            outcomes.drop_in_flight()  # frames in flight when the service stops: counted
            await self._close_opened()  # closed by the camera stage, unless it never ran
            self._done.set()

    async def _close_opened(self) -> None:
        """Close the source opened as the service started, if there is one (shielded,
        within :data:`~pipelines.dms.frames.source.CLOSE_BOUND`; closing twice is harmless)."""
        if self._opened is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_BOUND):
                await self._opened.aclose()

    async def _stop_on_sink_failure(self, frames: anyio.CancelScope) -> None:
        """A sink that fails (or whose reader closed it) ends the service: the summary says
        why."""
        await self.outcomes.watch_sinks()
        frames.cancel()

    async def _start(
        self, services: anyio.abc.TaskGroup, model_cpus: frozenset[int] | None
    ) -> Warpers:
        """Start what runs beside the frames; return the warpers, once there is a model to run
        frames (or it takes too long to come up: its frames then say so)."""
        cfg = self.config
        if cfg.health_port is not None:
            app = create_app(self.health, self.metrics)
            self.health_port = await serve_health(services, app, cfg.health_host, cfg.health_port)
        calibration = calibration_kind(cfg.calib)
        if calibration.follows:  # a stream given (embedding) stands in for the kind's own
            stream = self._calibration_stream or calibration.open()
            services.start_soon(self._calibration.follow, stream)
        await load_model(services, self.device, model_cpus, named=cfg.model is not None)
        services.start_soon(self.outcomes.follow_availability)
        return await ready_for_frames(self.device, cfg)


def _name(camera: CameraSpec) -> str:
    """The name of what the service reads: its file's (or route segment directory's) name."""
    return (camera.path.name or str(camera)) if isinstance(camera, CameraFile) else str(camera)

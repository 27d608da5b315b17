"""Health and metrics over HTTP: KServe v2 style health endpoints and Prometheus ``/metrics``.

- ``GET /v2/health/live``: 200 while the process serves requests.
- ``GET /v2/health/ready``: 200 when the service produces outputs (available or degraded), else
  503; the body says which, and why.
- ``GET /v2/models/dms/ready``: the same for the DMS model, KServe's per-model form.
- ``GET /metrics``: Prometheus text format — frames in, published (valid / invalid), dropped (by
  stage), per-stage latency histograms, timeouts per layer, the availability state.

Served by hypercorn (asyncio or trio, through the running anyio backend) on loopback by default
(design C9): an address that is not loopback is refused unless asked for. Nothing here can change
device state, so no authentication is needed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc
import sniffio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aio_runtime import Availability

from .config_values import is_loopback

__all__ = ["HealthState", "Metrics", "create_app", "serve"]

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class HealthState:
    """What the endpoints report: the availability, why, and the readiness layers."""

    availability: Availability
    reason: str | None
    readiness: Mapping[str, bool]

    def __post_init__(self) -> None:
        object.__setattr__(self, "availability", Availability(self.availability))

    @property
    def ready(self) -> bool:
        """Outputs are produced (available or degraded)."""
        return self.availability is not Availability.UNAVAILABLE


class Metrics:
    """The service's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.frames_in = Counter("dms_frames_in", "Camera frames received", registry=r)
        self.frames_published = Counter(
            "dms_frames_published", "Frames published", ["valid"], registry=r
        )
        self.frames_dropped = Counter(
            "dms_frames_dropped", "Frames dropped (latest frame wins)", ["stage"], registry=r
        )
        self.stage_latency = Histogram(
            "dms_stage_seconds",
            "Time per frame in each stage",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end = Histogram(
            "dms_frame_age_seconds",
            "Start of frame to publication",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.timeouts = Counter("dms_timeouts", "Timeouts by layer", ["layer"], registry=r)
        self.availability = Gauge(
            "dms_availability", "1 for the current availability state", ["state"], registry=r
        )

    def set_availability(self, availability: Availability) -> None:
        for state in Availability:
            self.availability.labels(state=state.value).set(1.0 if state == availability else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def create_app(state: Callable[[], HealthState], metrics: Metrics) -> Starlette:
    """The HTTP application; ``state()`` is read on every request."""

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    def readiness_body(current: HealthState) -> dict[str, object]:
        return {
            "ready": current.ready,
            "availability": current.availability.value,
            "reason": current.reason,
            "readiness": dict(current.readiness),
        }

    async def ready(request: Request) -> Response:
        current = state()
        return JSONResponse(readiness_body(current), status_code=200 if current.ready else 503)

    async def model_ready(request: Request) -> Response:
        current = state()
        body = {"name": "dms", **readiness_body(current)}
        return JSONResponse(body, status_code=200 if current.ready else 503)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/v2/health/live", live),
            Route("/v2/health/ready", ready),
            Route("/v2/models/dms/ready", model_ready),
            Route("/metrics", prometheus),
        ]
    )


def _check_loopback(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"refusing to serve health and metrics on {host}: not a loopback address "
            "(pass allow_remote to serve beyond this machine)"
        )


async def serve(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 9032,
    allow_remote: bool = False,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until cancelled; reports the bound port through ``task_status`` (pass port
    0 to have one chosen)."""
    _check_loopback(host, allow_remote)
    from hypercorn.config import Config

    config = Config()
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    # Bind here so the chosen port is known before serving.

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    bound = sock.getsockname()[1]
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket from here
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as hypercorn_serve
    else:
        from hypercorn.asyncio import serve as hypercorn_serve  # type: ignore[assignment]
    # hypercorn stops cleanly through its shutdown trigger; cancelling it while a client keeps a
    # connection open fails inside hypercorn. So: shielded, stopped by the trigger, bounded.
    stopping, stopped = anyio.Event(), anyio.Event()
    shield = anyio.CancelScope(shield=True)

    async def server() -> None:
        try:
            with shield:
                await hypercorn_serve(app, config, shutdown_trigger=stopping.wait)  # type: ignore[arg-type]
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(server)
        task_status.started(bound)
        try:
            await anyio.Event().wait()  # until cancelled
        finally:
            stopping.set()
            with anyio.CancelScope(shield=True), anyio.move_on_after(config.graceful_timeout + 1):
                await stopped.wait()
            shield.cancel()  # a server that did not stop in time is cancelled after all

"""How the service starts, and how it says it could not: one typed error, :class:`StartupError`.

Everything the service needs before it takes its first frame is checked or opened first — the
machine's side of the config (a route segment as the camera: opened, its log read), the sinks,
the health endpoints' port, the model and its contract —
and a failure of any of them is one :class:`StartupError` out of ``async with DmsService(...)``
(never an exception group), naming the setting that changes it. Once started, the service says
where it listens: :class:`BoundEndpoints`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from starlette.applications import Starlette

from aio_runtime import CameraTimeout, run_in_thread

from ..config.settings import ServiceConfig
from ._device import ModelDevice
from ._stages import Warpers, plan_warps
from .endpoints import serve

# Imported with the service rather than on an application's event loop as the service starts:
# anyio's asyncio backend, which anyio imports on its first call there (about 20 ms), and the
# health endpoints' server, which they import as they start (about 100 ms).
for _module in ("anyio._backends._asyncio", "hypercorn.config", "hypercorn.asyncio"):
    importlib.import_module(_module)

__all__ = [
    "BoundEndpoints",
    "StartupError",
    "describe",
    "load_model",
    "ready_for_frames",
    "refused",
    "serve_health",
    "started_group",
    "startup_error",
]


class StartupError(Exception):
    """The service could not start. ``setting``: the :class:`~pipelines.dms.config.settings.ServiceConfig`
    field that changes it (None: no one setting does). The error behind it is its
    ``__cause__``."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.setting = setting


@dataclass(frozen=True)
class BoundEndpoints:
    """Where a started service listens, as bound (the port chosen where port 0 was asked for);
    None, or nothing, for an endpoint that is off."""

    health_host: str | None = None
    """The address of the health and metrics endpoints."""
    health_port: int | None = None
    sinks: tuple[tuple[str, str], ...] = ()
    """Each sink that listens, as it says (:meth:`~pipelines.dms.sinks.base.Sink.endpoint`): what
    it is and its address, e.g. ``("zmq", "tcp://127.0.0.1:9031")``, ``("cereal driverStateV2",
    "tcp://127.0.0.1:45495")``."""

    @property
    def health_url(self) -> str | None:
        """``http://HOST:PORT/``: the health endpoints (``v2/health/ready``...) and ``metrics``
        below it."""
        if self.health_host is None or self.health_port is None:
            return None
        host = f"[{self.health_host}]" if ":" in self.health_host else self.health_host
        return f"http://{host}:{self.health_port}/"

    @property
    def zmq(self) -> str | None:
        """The ZeroMQ endpoint (``--zmq``), e.g. ``tcp://127.0.0.1:9031``."""
        return next((where for what, where in self.sinks if what == "zmq"), None)

    @property
    def cereal(self) -> tuple[tuple[str, str], ...]:
        """The cereal sockets (``--cereal-zmq``) as (service, endpoint); empty when off."""
        return tuple(
            (what.removeprefix("cereal "), where)
            for what, where in self.sinks
            if what.startswith("cereal ")
        )

    def lines(self) -> list[str]:
        """One line per endpoint that is on: ``health: http://...``, ``zmq: tcp://...``,
        ``cereal driverStateV2: tcp://...``."""
        found = [("health", self.health_url), *self.sinks]
        return [f"{name}: {where}" for name, where in found if where is not None]


@contextlib.contextmanager
def refused(setting: str | None = None) -> Iterator[None]:
    """A :class:`ValueError` or :class:`OSError` inside, as the :class:`StartupError` for
    ``setting``."""
    try:
        yield
    except (ValueError, OSError) as exc:
        raise StartupError(describe(exc), setting=setting) from exc


def describe(error: BaseException) -> str:
    """One line for ``error``: the first error inside an exception group, by its message (and its
    type, where the message alone would not say what it is)."""
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return describe(error.exceptions[0])
    text = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, (OSError, ValueError, TimeoutError)) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def startup_error(error: BaseException) -> StartupError | None:
    """The :class:`StartupError` ``error`` is, or holds inside its exception groups."""
    if isinstance(error, StartupError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = startup_error(inner)
            if found is not None:
                return found
    return None


async def started_group(
    run: Callable[..., Coroutine[Any, Any, None]],
) -> anyio.abc.TaskGroup:
    """A task group running ``run`` once it has started (``task_status.started()``); what fails
    before that is raised as one :class:`StartupError` (the group is closed), not as a group: the
    one it holds, or one for any other error (a cancellation stays a cancellation)."""
    tg = anyio.create_task_group()
    await tg.__aenter__()
    try:
        await tg.start(run)
    except BaseException as exc:
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
        found = startup_error(exc)
        if found is not None:
            raise found.with_traceback(None) from found.__cause__
        if isinstance(exc, Exception):
            raise StartupError(f"could not start: {describe(exc)}") from exc
        raise
    return tg


async def serve_health(services: anyio.abc.TaskGroup, app: Starlette, host: str, port: int) -> int:
    """Serve the health endpoints in ``services``; the port bound (:class:`StartupError` for one
    in use). The host was checked against the loopback rule with the config."""
    health = functools.partial(serve, app, host=host, port=port, allow_remote=True)
    try:
        bound: int = await services.start(health)
    except OSError as exc:
        raise StartupError(
            f"health endpoints on {host} port {port}: {describe(exc)} (choose another port, "
            "0 for any free one, or none)",
            setting="health_port",
        ) from exc
    return bound


async def load_model(
    services: anyio.abc.TaskGroup,
    device: ModelDevice,
    model_cpus: frozenset[int] | None,
    *,
    named: bool,
) -> None:
    """Start serving ``device`` in ``services``, once its model is loaded and its contract read
    (:class:`StartupError` if it cannot be; ``named``: a model file was given, not the
    reference model)."""
    try:
        await services.start(device.serve, model_cpus)
    except Exception as exc:
        model = "the model" if named else "the reference model"
        raise StartupError(f"could not load {model}: {describe(exc)}", setting="model") from exc


async def ready_for_frames(device: ModelDevice, config: ServiceConfig) -> Warpers:
    """The warpers, once the device can run frames (or it takes too long to come up: its frames
    then say so)."""
    # One warper per geometry, the cabin cameras' planned before the first frame: a resolution
    # change mid-stream then costs no frame its budget.
    warpers = await run_in_thread(
        plan_warps, awaited="warp plans", error=CameraTimeout, timeout=config.warp_plan_timeout
    )
    # A recording replayed from its start loses no frame to the model loading.
    with anyio.move_on_after(config.model_load_timeout + config.device_open_timeout):
        await device.ready.wait()
    return warpers

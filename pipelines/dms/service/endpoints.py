"""Health, metadata and metrics over HTTP: KServe v2 (the Open Inference Protocol's REST health
and metadata endpoints) and Prometheus ``/metrics``.

- ``GET /v2``: server metadata, ``{"name": "aio-dms", "version": ..., "extensions": []}``.
- ``GET /v2/health/live``: 200 while the process serves requests.
- ``GET /v2/health/ready``: 200 when the service produces outputs (available or degraded), else
  503; the body says which, and why (``reason``; ``error`` too when not ready).
- ``GET /v2/models/dms/ready``, ``GET /v2/models/dms/versions/1/ready``: the same for the DMS
  model, KServe's per-model form.
- ``GET /v2/models/dms``, ``GET /v2/models/dms/versions/1``: model metadata from the contract of
  the loaded model — ``name``, ``versions``, ``platform`` (``onnx_onnxv1``), ``inputs`` and
  ``outputs``, each ``{"name", "datatype", "shape"}`` (KServe's data types; -1 for a symbolic
  dimension); 503 until a model is loaded.
- ``GET /metrics``: Prometheus, through prometheus_client's ASGI app: the text format, or
  OpenMetrics when the ``Accept`` header asks for it (see :mod:`pipelines.dms.service.metrics`).

The service serves one model, ``dms``, at one version, ``1``. Every error is JSON,
``{"error": "..."}``: 404 for an unknown path, model or version, 405 for a method other than GET
(or HEAD), 503 while not ready or before the model is loaded, 500 for a failure of the server.

Served by hypercorn (asyncio or trio, through the running anyio backend) on loopback by default
(design C9): an address that is not loopback is refused unless asked for. Nothing here can change
device state, so no authentication is needed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import sniffio
from prometheus_client import make_asgi_app
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from aio_runtime import Availability

from ... import __version__
from ..config.values import is_loopback
from .metrics import Metrics

if TYPE_CHECKING:
    from ..model.contract import ModelContract, TensorSpec

__all__ = [
    "MODEL_NAME",
    "MODEL_VERSION",
    "PLATFORM",
    "SERVER_NAME",
    "HealthState",
    "Metrics",
    "create_app",
    "model_metadata",
    "serve",
]

SERVER_NAME = "aio-dms"
MODEL_NAME = "dms"
MODEL_VERSION = "1"
PLATFORM = "onnx_onnxv1"
"""KServe's platform name for an ONNX model run by ONNX Runtime."""

_DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "object": "BYTES",
}
"""numpy's element type names as KServe's tensor data types."""


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


def _tensor(spec: TensorSpec, shape: tuple[int, ...] | None) -> dict[str, Any]:
    return {
        "name": spec.name,
        "datatype": _DATATYPES.get(spec.dtype, spec.dtype.upper()),
        "shape": [-1] if shape is None else [d if d > 0 else -1 for d in shape],
    }


def model_metadata(contract: ModelContract) -> dict[str, Any]:
    """A model's contract as KServe v2 model metadata. An input whose graph declares no shape
    has the shape the service feeds it; an output that declares none, ``[-1]``."""
    from ..model.contract import EXPECTED_INPUTS

    def fed(spec: TensorSpec) -> tuple[int, ...] | None:
        expected = EXPECTED_INPUTS.get(spec.name)
        return spec.shape if spec.shape is not None or expected is None else expected.shape

    return {
        "name": MODEL_NAME,
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [_tensor(spec, fed(spec)) for spec in contract.inputs],
        "outputs": [_tensor(contract.output, contract.output.shape)],
    }


def _error(status: int, message: str, **fields: Any) -> JSONResponse:
    return JSONResponse({"error": message, **fields}, status_code=status)


def _unknown(request: Request) -> JSONResponse | None:
    """404 for a model or version this server does not serve; None for the one it does."""
    model = request.path_params["model"]
    version = request.path_params.get("version")
    if model != MODEL_NAME:
        return _error(404, f"unknown model {model!r}: this server serves {MODEL_NAME!r}")
    if version is not None and version != MODEL_VERSION:
        return _error(
            404, f"model {MODEL_NAME!r} has no version {version!r} (versions: {MODEL_VERSION})"
        )
    return None


class _Asgi:
    """An ASGI app as a route's endpoint (a plain function would be taken for a request
    handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def create_app(state: Callable[[], HealthState], metrics: Metrics) -> Starlette:
    """The HTTP application; ``state()`` is read on every request, and the model's contract
    from ``metrics`` (:attr:`Metrics.model`)."""

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": SERVER_NAME, "version": __version__, "extensions": []})

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    def readiness(current: HealthState, **fields: Any) -> Response:
        body = {
            **fields,
            "ready": current.ready,
            "availability": current.availability.value,
            "reason": current.reason,
            "readiness": dict(current.readiness),
        }
        if current.ready:
            return JSONResponse(body)
        why = current.availability.value + (f": {current.reason}" if current.reason else "")
        return _error(503, f"not ready ({why})", **body)

    async def ready(request: Request) -> Response:
        return readiness(state())

    async def model_ready(request: Request) -> Response:
        unknown = _unknown(request)
        if unknown is not None:
            return unknown
        return readiness(state(), name=MODEL_NAME)

    async def model(request: Request) -> Response:
        unknown = _unknown(request)
        if unknown is not None:
            return unknown
        contract = metrics.model
        if contract is None:
            current = state()
            why = f" ({current.reason})" if current.reason else ""
            return _error(503, f"model {MODEL_NAME!r} is not loaded yet{why}")
        return JSONResponse(model_metadata(contract))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        if exc.status_code == 404:
            return _error(404, f"no such endpoint: {path}")
        if exc.status_code == 405:
            return _error(405, f"{request.method} is not allowed on {path}: only GET")
        return _error(exc.status_code, str(exc.detail))

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error(500, f"{request.url.path} failed: {type(exc).__name__}: {exc}")

    return Starlette(
        routes=[
            Route("/v2", server_metadata),
            Route("/v2/health/live", live),
            Route("/v2/health/ready", ready),
            Route("/v2/models/{model}", model),
            Route("/v2/models/{model}/ready", model_ready),
            Route("/v2/models/{model}/versions/{version}", model),
            Route("/v2/models/{model}/versions/{version}/ready", model_ready),
            Route("/metrics", _Asgi(make_asgi_app(registry=metrics.registry)), methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
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

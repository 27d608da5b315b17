"""Health and metrics endpoints: their answers while available and while unavailable."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette

from pipelines import __version__
from pipelines.dms.config.kinds import Mode
from pipelines.dms.model.contract import TensorSpec, read_contract
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.service.endpoints import HealthState, create_app, model_metadata, serve
from pipelines.dms.service.metrics import STAGES, Metrics, ServiceRegistry
from pipelines.dms.sinks.base import SinkStats

pytestmark = pytest.mark.anyio

LAYERS = {"deviceOnline": True, "firmwareReady": True, "queueSubmittable": True}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_health_and_metrics_while_available_and_while_unavailable():
    state = HealthState("available", None, LAYERS)
    metrics = Metrics()
    metrics.frames_in.inc(3)
    metrics.frames_published.labels(valid="true").inc(2)
    metrics.timeouts.labels(layer="gpu-queue").inc()
    metrics.set_availability("available")
    app = create_app(lambda: state, metrics)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            port = await tg.start(lambda task_status: serve(app, port=0, task_status=task_status))
            base = f"http://127.0.0.1:{port}"

            async def fetch(path: str) -> tuple[int, str]:
                return await anyio.to_thread.run_sync(get, base + path)

            assert (await fetch("/v2/health/live"))[0] == 200
            status, body = await fetch("/v2/health/ready")
            assert status == 200 and json.loads(body)["availability"] == "available"
            status, body = await fetch("/v2/models/dms/ready")
            assert status == 200 and json.loads(body)["name"] == "dms"
            status, body = await fetch("/metrics")
            assert status == 200
            assert "dms_frames_in_total 3.0" in body
            assert 'dms_frames_published_total{valid="true"} 2.0' in body
            assert 'dms_timeouts_total{layer="gpu-queue"} 1.0' in body
            assert 'dms_availability{state="available"} 1.0' in body

            state = HealthState(
                "unavailable", "gpu-queue: compute timeline >= 7: timed out", LAYERS
            )
            status, body = await fetch("/v2/health/ready")
            assert status == 503 and json.loads(body)["reason"].startswith("gpu-queue")
            status, body = await fetch("/v2/models/dms/ready")
            assert status == 503 and json.loads(body)["ready"] is False
            assert (await fetch("/v2/health/live"))[0] == 200  # alive all the same
            tg.cancel_scope.cancel()


async def test_a_non_loopback_address_is_refused():
    app = create_app(lambda: HealthState("available", None, {}), Metrics())
    with pytest.raises(ValueError, match="not a loopback"):
        await serve(app, host="0.0.0.0", port=0)


async def test_stopping_with_a_client_connection_still_open_is_clean():
    import http.client

    app = create_app(lambda: HealthState("available", None, LAYERS), Metrics())
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            port = await tg.start(lambda task_status: serve(app, port=0, task_status=task_status))

            def keep_alive() -> http.client.HTTPConnection:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/v2/health/live")
                connection.getresponse().read()
                return connection  # left open: a scraper's keep-alive connection

            connection = await anyio.to_thread.run_sync(keep_alive)
            tg.cancel_scope.cancel()  # must not fail inside the server
    connection.close()


# -- through the app, in process: every path, status and JSON body ---------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json", self.headers
        return json.loads(self.body)


async def call(app, path: str, *, method: str = "GET", accept: str | None = None) -> Answer:
    """One request through the ASGI app, as a server would make it: its status, headers and
    body. (A failure the app answered 500 is raised after its answer, as Starlette does for the
    server to log: the answer is on the exception.)"""
    path, _, query = path.partition("?")
    headers = [] if accept is None else [(b"accept", accept.encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 9032),
    }
    requested = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    def answer() -> Answer:
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        fields = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        return Answer(start["status"], fields, body)

    try:
        await app(scope, receive, send)
    except Exception as exc:
        exc.answer = answer()
        raise
    return answer()


@dataclass
class Device:
    """What the metrics read of a model's device."""

    contract: object = None
    restarts: int = 0


@pytest.fixture(scope="module")
def contract():
    return read_contract(reference_model_path())


def app_for(state: HealthState, contract=None, **metrics) -> tuple[Starlette, Metrics]:
    served = Metrics(**metrics)
    served.read_from(device=Device(contract))
    return create_app(lambda: state, served), served


AVAILABLE = HealthState("available", None, LAYERS)
DEGRADED = HealthState("degraded", "calibration: stale", LAYERS)
UNAVAILABLE = HealthState("unavailable", "accelerator: opening session (attempt 2)", LAYERS)


async def test_server_metadata_names_the_server_its_version_and_no_extensions():
    app, _ = app_for(AVAILABLE)
    answer = await call(app, "/v2")
    assert answer.status == 200
    assert answer.json() == {"name": "aio-dms", "version": __version__, "extensions": []}


@pytest.mark.parametrize("path", ["/v2/models/dms", "/v2/models/dms/versions/1"])
async def test_model_metadata_is_the_loaded_model_s_contract(path, contract):
    app, _ = app_for(AVAILABLE, contract)
    answer = await call(app, path)
    assert answer.status == 200
    assert answer.json() == {
        "name": "dms",
        "versions": ["1"],
        "platform": "onnx_onnxv1",
        "inputs": [
            {"name": "input_img", "datatype": "UINT8", "shape": [1, 1382400]},
            {"name": "calib", "datatype": "FP32", "shape": [1, 3]},
        ],
        "outputs": [{"name": "outputs", "datatype": "FP32", "shape": [1, contract.output_length]}],
    }


def test_model_metadata_gives_symbolic_dimensions_as_minus_one_and_fed_shapes(contract):
    img, calib = contract.inputs
    symbolic = dataclasses.replace(
        contract,
        inputs=(
            dataclasses.replace(img, shape=(0, 1382400)),
            dataclasses.replace(calib, shape=None),
        ),
        output=TensorSpec("heads", None, "float32"),
    )
    metadata = model_metadata(symbolic)
    assert metadata["inputs"] == [
        {"name": "input_img", "datatype": "UINT8", "shape": [-1, 1382400]},
        {"name": "calib", "datatype": "FP32", "shape": [1, 3]},  # what the service feeds it
    ]
    assert metadata["outputs"] == [{"name": "heads", "datatype": "FP32", "shape": [-1]}]


@pytest.mark.parametrize("path", ["/v2/models/dms", "/v2/models/dms/versions/1"])
async def test_model_metadata_before_the_model_is_loaded_is_503_saying_so(path):
    app, _ = app_for(HealthState("unavailable", "accelerator: loading the model", LAYERS))
    answer = await call(app, path)
    assert answer.status == 503
    assert answer.json() == {
        "error": "model 'dms' is not loaded yet (accelerator: loading the model)"
    }


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v2/models/other", "unknown model 'other': this server serves 'dms'"),
        ("/v2/models/other/ready", "unknown model 'other': this server serves 'dms'"),
        ("/v2/models/other/versions/1", "unknown model 'other': this server serves 'dms'"),
        ("/v2/models/other/versions/1/ready", "unknown model 'other': this server serves 'dms'"),
        ("/v2/models/dms/versions/2", "model 'dms' has no version '2' (versions: 1)"),
        ("/v2/models/dms/versions/2/ready", "model 'dms' has no version '2' (versions: 1)"),
        ("/v2/models/dms/versions/1/infer", "no such endpoint: /v2/models/dms/versions/1/infer"),
        ("/v3", "no such endpoint: /v3"),
        ("/", "no such endpoint: /"),
    ],
)
async def test_an_unknown_model_version_or_path_is_404_with_a_json_error(path, error, contract):
    app, _ = app_for(AVAILABLE, contract)
    answer = await call(app, path)
    assert (answer.status, answer.json()) == (404, {"error": error})


@pytest.mark.parametrize("path", ["/v2", "/v2/health/ready", "/v2/models/dms", "/metrics"])
async def test_a_method_other_than_get_is_405_with_a_json_error(path, contract):
    app, _ = app_for(AVAILABLE, contract)
    answer = await call(app, path, method="POST")
    assert (answer.status, answer.json()) == (
        405,
        {"error": f"POST is not allowed on {path}: only GET"},
    )


async def test_a_failure_inside_the_server_is_500_with_a_json_error():
    def broken() -> HealthState:
        raise RuntimeError("the state could not be read")

    app = create_app(broken, Metrics())
    with pytest.raises(RuntimeError) as raised:
        await call(app, "/v2/health/ready")
    answer = raised.value.answer
    assert (answer.status, answer.json()) == (
        500,
        {"error": "/v2/health/ready failed: RuntimeError: the state could not be read"},
    )


READY_PATHS = ["/v2/health/ready", "/v2/models/dms/ready", "/v2/models/dms/versions/1/ready"]


def named(path: str) -> dict[str, str]:
    """A model's readiness names the model; the server's does not."""
    return {"name": "dms"} if path.startswith("/v2/models/") else {}


@pytest.mark.parametrize("path", READY_PATHS)
@pytest.mark.parametrize("state", [AVAILABLE, DEGRADED], ids=["available", "degraded"])
async def test_ready_is_200_while_outputs_are_produced(path, state):
    app, _ = app_for(state)
    answer = await call(app, path)
    assert answer.status == 200
    assert answer.json() == {
        **named(path),
        "ready": True,
        "availability": state.availability.value,
        "reason": state.reason,
        "readiness": LAYERS,
    }


@pytest.mark.parametrize("path", READY_PATHS)
async def test_not_ready_is_503_with_the_reason_in_the_json_body(path):
    app, _ = app_for(UNAVAILABLE)
    answer = await call(app, path)
    assert answer.status == 503
    assert answer.json() == {
        **named(path),
        "error": "not ready (unavailable: accelerator: opening session (attempt 2))",
        "ready": False,
        "availability": "unavailable",
        "reason": "accelerator: opening session (attempt 2)",
        "readiness": LAYERS,
    }


# -- /metrics: the text format or OpenMetrics, no _created series ------------------------------

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def sink(name: str, dropped: int) -> SinkStats:
    return SinkStats(name, Mode.LIVE, published=dropped + 1, delivered=1, dropped=dropped)


async def test_metrics_negotiate_openmetrics_from_the_accept_header(contract):
    app, metrics = app_for(AVAILABLE, contract)
    metrics.frames_in.inc(3)
    text = await call(app, "/metrics")
    assert text.status == 200
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "dms_frames_in_total 3.0" in text.body.decode()
    assert "# EOF" not in text.body.decode()

    openmetrics = await call(app, "/metrics", accept=OPENMETRICS)
    assert openmetrics.status == 200
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    body = openmetrics.body.decode()
    assert body.endswith("# EOF\n")
    assert "dms_frames_in_total 3.0" in body
    assert "# TYPE dms_frames_in counter" in body  # OpenMetrics names a counter without _total


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
@pytest.mark.parametrize(
    "query", ["", "?name[]=dms_frames_in_total&name[]=dms_stage_seconds_count"]
)
async def test_no_created_series_in_either_format_nor_in_a_restricted_scrape(
    accept, query, contract
):
    app, metrics = app_for(AVAILABLE, contract)
    metrics.frames_in.inc()
    metrics.invalid_frames.labels(kind="camera").inc()
    metrics.stage_latency.labels(stage="warp").observe(0.003)
    metrics.transition("available")
    body = (await call(app, "/metrics" + query, accept=accept)).body.decode()
    assert "dms_frames_in_total" in body
    assert "_created" not in body
    # the same metrics in a plain registry do show them: the filter is what removes them
    plain = CollectorRegistry()
    Counter("dms_frames_in", "Camera frames received", registry=plain).inc()
    assert "dms_frames_in_created" in generate_latest(plain).decode()


async def test_every_series_shows_from_the_start_and_build_info_names_the_model(contract):
    app, metrics = app_for(AVAILABLE, contract, version="1.2.3")
    metrics.read_from(sinks=lambda: [sink("subscriptions", 4), sink("jsonl run.jsonl", 0)])
    body = (await call(app, "/metrics")).body.decode()
    samples = parse(body)
    for stage in STAGES:
        assert samples[f'dms_stage_seconds_count{{stage="{stage}"}}'] == 0.0
    for state in ("available", "degraded", "unavailable"):
        assert samples[f'dms_availability_transitions_total{{to="{state}"}}'] == 0.0
    assert samples["dms_accelerator_restarts_total"] == 0.0
    assert samples['dms_sink_dropped_total{sink="subscriptions"}'] == 4.0
    assert samples['dms_sink_dropped_total{sink="jsonl run.jsonl"}'] == 0.0
    checkpoint = contract.model_checkpoint
    assert samples[f'dms_build_info{{model="{checkpoint}",version="1.2.3"}}'] == 1.0
    assert samples["process_cpu_seconds_total"] >= 0.0
    assert "process_start_time_seconds" in samples


async def test_the_read_series_move_with_what_they_read(contract):
    device = Device()
    metrics = Metrics(version="1.2.3")
    drops = {"subscriptions": 0}
    metrics.read_from(device=device, sinks=lambda: [sink(name, n) for name, n in drops.items()])
    app = create_app(lambda: AVAILABLE, metrics)
    samples = parse((await call(app, "/metrics")).body.decode())
    assert samples['dms_build_info{model="",version="1.2.3"}'] == 1.0  # no model loaded yet
    device.restarts, device.contract, drops["subscriptions"] = 2, contract, 7
    samples = parse((await call(app, "/metrics")).body.decode())
    assert samples["dms_accelerator_restarts_total"] == 2.0
    assert samples['dms_sink_dropped_total{sink="subscriptions"}'] == 7.0
    assert samples[f'dms_build_info{{model="{contract.model_checkpoint}",version="1.2.3"}}'] == 1.0
    unnamed = dataclasses.replace(contract, model_checkpoint="")
    device.contract = unnamed
    assert metrics.model_name() == contract.path.name  # a model naming no checkpoint: its file


def parse(text: str) -> dict[str, float]:
    """Sample lines of the text format, by name and labels."""
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name and not name.startswith("#")
    }


def test_a_collector_unregistered_from_the_service_registry_leaves_it():
    registry = ServiceRegistry()
    counter = Counter("extra", "An extra counter", registry=registry)
    assert registry.get_sample_value("extra_total") == 0.0
    registry.unregister(counter)
    assert registry.get_sample_value("extra_total") is None

"""Health and metrics endpoints: their answers while available and while unavailable."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anyio
import anyio.to_thread
import pytest

from pipelines.dms.endpoints import HealthState, Metrics, create_app, serve

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

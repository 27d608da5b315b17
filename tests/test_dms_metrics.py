"""The service's Prometheus series move as their events happen: every stage observed, invalid
frames by kind, availability transitions, sink drops, accelerator restarts, build info."""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections import Counter

import anyio
import anyio.to_thread
import pytest

from aio_runtime import Ledger, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines import __version__
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.model.reference import REFERENCE_CHECKPOINT
from pipelines.dms.service import DmsService
from pipelines.dms.service.metrics import STAGES

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hold= is for asyncio's loop


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={} if accept is None else {"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def changes(transitions: list[tuple[float, str]]) -> Counter[str]:
    """The summary's availability changes by the state changed to (a new reason alone is none)."""
    states = [text.partition("(")[0] for _, text in transitions]
    return Counter(after for before, after in itertools.pairwise(states) if after != before)


def sample(service: DmsService, name: str, **labels: str) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels)


NAN_FRAMES = range(20, 30)
"""Frames whose output is NaN: enough that some are decoded however many a busy machine drops."""


HELD_AT = 40
"""The camera holds this frame back until the service has been scraped (it must still serve)."""


async def held_camera(scraped: anyio.Event):
    """Synthetic frames, the :data:`HELD_AT`-th held back until ``scraped`` is set."""
    number = 0
    async with SyntheticCamera() as camera:
        async for frame in camera:
            if number == HELD_AT:
                await scraped.wait()
            number += 1
            yield frame


async def scrape_after_the_fault(service: DmsService, frame: int, scraped: anyio.Event) -> None:
    """Once ``frame`` is published, :func:`scrape` the running service; then let the camera
    go on."""
    try:
        async for message in service.messages(backlog=100):
            if message.frame_id >= frame:
                break
        await scrape(service)
    finally:
        scraped.set()


async def scrape(service: DmsService) -> None:
    """``/metrics`` as OpenMetrics (no ``_created`` series; the invalid frames counted as the
    summary counts them, read just before and after) and the model's metadata, over HTTP."""
    base = f"http://127.0.0.1:{service.health_port}"
    before = service.summary.frames.invalid["invalid output"]
    status, kind, text = await anyio.to_thread.run_sync(get, base + "/metrics", OPENMETRICS)
    after = service.summary.frames.invalid["invalid output"]
    assert status == 200 and kind.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n") and "_created" not in text
    line = 'dms_invalid_frames_total{kind="invalid output"} '
    scraped = [float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line)]
    assert len(scraped) == 1 and 1 <= before <= scraped[0] <= after, (before, scraped, after)
    status, _, body = await anyio.to_thread.run_sync(get, base + "/v2/models/dms")
    assert status == 200 and json.loads(body)["inputs"][0]["name"] == "input_img"


async def test_the_series_move_as_frames_end_and_are_served_over_http(tmp_path):
    config = ServiceConfig(
        device="cpu",
        calib=(0.0, 0.0, 0.0),
        budget=0.5,
        frames=45,
        faults=f"nan-output@{NAN_FRAMES.start}+{len(NAN_FRAMES)}",
        health_port=0,
        jsonl=str(tmp_path / "run.jsonl"),
    )
    scraped = anyio.Event()
    with anyio.fail_after(60):
        async with DmsService(config, source=held_camera(scraped)) as service:
            unread = service.messages(backlog=1)  # never read: it keeps the newest only
            async with anyio.create_task_group() as tg:
                tg.start_soon(scrape_after_the_fault, service, NAN_FRAMES.stop, scraped)
                await service.finished()
            assert scraped.is_set()
    frames = service.summary.frames
    frames.check()

    # every stage observed: the camera's and the publication's for every frame
    counts = {stage: sample(service, "dms_stage_seconds_count", stage=stage) for stage in STAGES}
    assert counts["camera"] == frames.received == config.frames
    assert counts["publish"] == frames.valid + sum(frames.invalid.values())
    assert 0 < counts["decode"] <= counts["model"] <= counts["warp"] <= counts["camera"]

    # invalid frames by kind: the summary's counts, the NaN outputs among them
    assert frames.invalid["invalid output"] >= 1, frames.invalid  # the NaNs (unless dropped)
    for kind, count in frames.invalid.items():
        assert sample(service, "dms_invalid_frames_total", kind=kind) == count

    # availability changes by state: up at the start, down at the NaNs, up again
    seen = changes(service.summary.transitions)
    assert seen["available"] >= 1 and seen["unavailable"] + seen["degraded"] >= 1, seen
    for state in ("available", "degraded", "unavailable"):
        assert sample(service, "dms_availability_transitions_total", to=state) == seen[state]

    # drops by sink: the unread subscriber's, none in the file
    dropped = {stats.name: stats.dropped for stats in service.summary.sinks}
    mine = unread.stats()  # it read none: once closed, every message it was given is dropped
    assert mine.delivered == 0 and mine.dropped == mine.published > 0, mine
    assert dropped["subscriptions"] >= mine.dropped
    for name, count in dropped.items():
        assert sample(service, "dms_sink_dropped_total", sink=name) == count

    assert sample(service, "dms_accelerator_restarts_total") == 0.0  # the CPU never restarts
    build = {"model": REFERENCE_CHECKPOINT, "version": __version__}
    assert sample(service, "dms_build_info", **build) == 1.0
    assert sample(service, "process_cpu_seconds_total") > 0.0


async def test_an_accelerator_restart_is_counted_once_per_failed_session():
    """One hung frame: the session fails once and is opened again (the next frames run)."""
    config = ServiceConfig(
        device="sim", health_port=None, calib=(0.0, 0.0, 0.0), frames=50, faults="gpu-hang@20"
    )
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=0.005, hold=threads_busy(ledger)):
            with anyio.fail_after(30):
                async with DmsService(config, source=SyntheticCamera()) as service:
                    restarts = []

                    async def before_the_hang():
                        async for message in service.messages(backlog=config.frames):
                            if message.frame_id >= 0 and message.valid:
                                restarts.append(sample(service, "dms_accelerator_restarts_total"))
                                return

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(before_the_hang)
                        await service.finished()
    transitions = [text for _, text in service.summary.transitions]
    assert restarts == [0.0]  # a valid frame before the hang: none yet
    assert any("attempt 1 failed" in text for text in transitions), transitions
    assert not any("attempt 2 failed" in text for text in transitions), transitions
    assert sample(service, "dms_accelerator_restarts_total") == 1.0
    assert changes(service.summary.transitions)["available"] >= 2  # up again after the restart

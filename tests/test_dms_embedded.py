"""The DMS service as a guest in an application: it writes nothing to the application's standard
output or error, and what it does that takes long — building the synthetic scene, reading the
model file and its contract, creating onnxruntime sessions, planning the warps — runs on worker
threads, not on the application's event loop."""

from __future__ import annotations

import functools
import threading

import anyio
import onnx
import onnxruntime
import pytest
from quiet_host import unconfigured_logging

from pipelines.dms.backends import base as _backends
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames import synthetic as camera_synthetic
from pipelines.dms.model import contract as model
from pipelines.dms.model.warp import Warper
from pipelines.dms.service import DmsService

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Where:
    """The names of the threads each wrapped call ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.threads: dict[str, list[str]] = {}

    def record(self, owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            self.threads.setdefault(label, []).append(threading.current_thread().name)
            return original(*args, **kwargs)

        self.monkeypatch.setattr(owner, name, wrapper)


@pytest.fixture
def where(monkeypatch):
    where = Where(monkeypatch)
    monkeypatch.setattr(camera_synthetic, "_scenes", {})  # built again, in this test
    where.record(camera_synthetic._Scene, "__init__", "scene")
    where.record(_backends, "reference_model_path", "reference model file")
    where.record(onnx, "load", "model file read")
    where.record(model, "parse_output_slices", "metadata parsed")
    where.record(onnxruntime, "InferenceSession", "onnxruntime session")
    where.record(Warper, "plan_for", "warp plan")
    return where


async def run_service(service: DmsService) -> None:
    with anyio.fail_after(90):
        async with service:
            await service.finished()


@pytest.mark.parametrize("device", ["sim", "cpu"])
async def test_start_up_work_runs_on_worker_threads_not_on_the_loop(where, device):
    loop_thread = threading.current_thread().name
    config = ServiceConfig(device=device, frames=3, health_port=None, calib=(0.0, 0.0, 0.0))
    await run_service(DmsService(config))
    sessions = 2 if device == "sim" else 1  # the contract's check, and the kernel's (or runner's)
    assert sorted(where.threads) == [
        "metadata parsed",
        "model file read",
        "onnxruntime session",
        "reference model file",
        "scene",
        "warp plan",
    ]
    assert len(where.threads["onnxruntime session"]) >= sessions
    for label, threads in where.threads.items():
        assert loop_thread not in threads, f"{label} ran on the event loop's thread"
    assert all(name.startswith("worker: ") for name in where.threads["scene"])


async def test_the_synthetic_cameras_scene_is_built_on_a_worker_thread(where):
    camera = camera_synthetic.SyntheticCamera("os_fisheye", switch_at=1)
    assert where.threads == {}  # nothing built as it is made
    await camera.open()
    assert (
        where.threads["scene"]
        == ["worker: the synthetic camera's scene (1344x760 and 1928x1208)"] * 2
    )
    await camera.open()  # built once
    assert len(where.threads["scene"]) == 2


async def test_an_embedded_service_writes_nothing_to_standard_output_or_error(capfd):
    # The GPU hangs from frame 5 on, to meet the session however long a loaded host takes to
    # open it; the service runs until the hang was met (the session failed: warnings were logged).
    config = ServiceConfig(health_port=None, calib=(0.0, 0.0, 0.0), faults="gpu-hang@5+100000")
    service = DmsService(config)
    reasons = []
    with unconfigured_logging(), anyio.fail_after(90):
        async with service:
            with service.transitions() as stream:
                async for transition in stream:
                    reasons.append(transition.current.reason or "")
                    if "gpu-queue" in reasons[-1] and "timed out" in reasons[-1]:
                        break
    # ... and not one byte reached file descriptors 1 or 2.
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")

"""Benchmark: the DMS pipeline as an openpilot-style synchronous loop and through the service.

The same stages — warp (our :class:`~pipelines.dms.model.warp.Warper`), the bundled reference model on
onnxruntime with the same thread settings (printed), decode — on the synthetic camera, for both
cabin cameras, at 20 Hz and at the maximum rate:

* ``sync``: one thread, frame after frame (as ``dmonitoringmodeld`` runs);
* ``service``: :class:`~pipelines.dms.service.DmsService` (``--device cpu``), latest frame wins.

The two run in interleaved rounds; each reported figure is the median over the rounds. Reported:
frames/s; end-to-end latency p50/p99 (start of frame to published, the camera's readout included);
the per-frame overhead beyond the warp and model compute (from the frame being handed over to
published, minus that compute); how late after its end of frame the source handed the frame over
(``late``: a sleep for the synchronous loop, a loop timer for the service; both sources' artefacts,
in the latency but not the overhead); process CPU per frame; and, for the service, the event
loop's lag — how late a 1 ms timer fires while the pipeline runs (a synchronous loop has no event
loop to serve health checks or deadlines at all; asyncio's timers alone fire up to ~1 ms late).
Final JSON line with ``sync_fps``, ``service_fps`` (maximum rate, 1928x1208),
``overhead_p99_ms_20hz``, ``latency_p99_ms_20hz``, ``loop_lag_p99_ms`` (the worst service row).
Targets: overhead p99 at 20 Hz <= 2 ms; service_fps >= 0.95 x sync_fps; loop lag p99 <= 2 ms
(``targets_met``). A round that fails is reported and left out, see :mod:`benchmarks._report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import onnxruntime as ort

from aio_runtime import now
from benchmarks._report import Report, cell, median, ratio, rounded, run
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.frame import AR_OX_FISHEYE, OS_FISHEYE, CameraConfig, Frame
from pipelines.dms.frames.source import SourceBase, clock_ns
from pipelines.dms.model.contract import load_contract
from pipelines.dms.model.decode import Decoder
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.model.warp import Warper
from pipelines.dms.service import DmsService

THREADS = 1
_CPUS = sorted(os.sched_getaffinity(0))
MODEL_CPUS = (_CPUS[-1],) if len(_CPUS) >= 2 else None
"""As ``aio-dms run`` places them: the model's thread on the last CPU, the event loop off it."""
TARGETS = {"overhead_p99_ms_20hz": 2.0, "fps_ratio": 0.95, "loop_lag_p99_ms": 2.0}


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_sync(camera: CameraConfig, fps: float | None, frames: int) -> dict[str, Any]:
    """openpilot's shape: one thread; wait for the frame, warp, run, decode, publish."""
    path = reference_model_path()
    contract = load_contract(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    warper = Warper()
    decoder = Decoder(contract.output_slices)
    calib = np.zeros((1, 3), np.float32)
    layout = camera.layout
    buffer = np.random.default_rng(0).integers(0, 256, layout.size, dtype=np.uint8)
    period = 1.0 / fps if fps else 0.0
    readout = camera.readout_ns / 1e9
    latencies, overheads, lateness = [], [], []
    cpu0, start = time.process_time(), time.perf_counter()
    next_sof = time.perf_counter()
    for _ in range(frames):
        sof = next_sof if fps else time.perf_counter()
        eof = sof + (readout if fps else 0.0)
        while fps and time.perf_counter() < eof:  # the frame is readable at end of frame
            time.sleep(max(0.0, eof - time.perf_counter()))
        t0 = time.perf_counter()
        img = warper.warp(buffer, camera.width, camera.height, layout.stride)
        (out,) = session.run(None, {"input_img": img, "calib": calib})
        compute = time.perf_counter() - t0
        decoder(np.asarray(out).reshape(-1))
        done = time.perf_counter()
        latencies.append(done - sof)
        overheads.append(done - t0 - compute)
        lateness.append(t0 - eof)
        next_sof = sof + period
    wall = time.perf_counter() - start
    return {
        "fps": frames / wall,
        "latency_p50_ms": _p(latencies, 50) * 1e3,
        "latency_p99_ms": _p(latencies, 99) * 1e3,
        "overhead_p99_ms": _p(overheads, 99) * 1e3,
        "late_p99_ms": _p(lateness, 99) * 1e3,
        "cpu_ms_per_frame": (time.process_time() - cpu0) / frames * 1e3,
        "loop_lag_p99_ms": float("nan"),
    }


class StillCamera(SourceBase):
    """Frames of one fixed buffer, as the synchronous loop uses: no rendering cost. At 20 Hz paced
    as a camera (delivered at end of frame, on a loop timer); at the maximum rate the next frame
    comes as soon as fewer than two are in the pipeline (the service overlaps one frame's warp and
    decode with the model run of another), with zero readout. Records when each frame was handed
    to the service: a loop timer fires up to 1 ms after the end of frame (the event loop's timer
    granularity, a property of this synthetic source: a camera's frames arrive on a socket), which
    is reported on its own (``late``), not as the service's overhead."""

    def __init__(self, camera: CameraConfig, fps: float | None, frames: int) -> None:
        self.camera, self.fps, self.frames = camera, fps, frames
        layout = camera.layout
        self.buffer = np.random.default_rng(0).integers(0, 256, layout.size, dtype=np.uint8)
        self.count = 0
        self.progress = anyio.Event()
        self.next_sof = clock_ns()
        self.ended: Callable[[], int] = lambda: 0
        """Frames the service has finished with (published or dropped)."""
        self.delivered_at: dict[int, float] = {}
        """Frame id -> when the service got it (loop clock, seconds)."""

    def done(self) -> None:
        """A message was published: a frame may have left the pipeline."""
        self.progress.set()

    async def _next_frame(self) -> Frame:
        if self.count >= self.frames:
            raise StopAsyncIteration
        while not self.fps and self.count - self.ended() >= 2:
            self.progress = anyio.Event()
            with anyio.move_on_after(0.05):  # a dropped frame publishes nothing: look again
                await self.progress.wait()
        if self.fps:
            sof = self.next_sof
            self.next_sof += round(1e9 / self.fps)
            eof = sof + self.camera.readout_ns
        else:
            sof = eof = clock_ns()
        self.count += 1
        layout = self.camera.layout
        return Frame(self.buffer, layout.width, layout.height, layout.stride, self.count, sof, eof)

    async def __anext__(self) -> Frame:
        frame = await super().__anext__()
        self.delivered_at[frame.frame_id] = now()
        return frame


async def run_service(camera: CameraConfig, fps: float | None, frames: int) -> dict[str, Any]:
    config = ServiceConfig(
        device="cpu",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
        intra_op_threads=THREADS,
        model_cpus=MODEL_CPUS,
        budget=1.0 if fps is None else 0.05,
    )
    source = StillCamera(camera, fps, frames)
    latencies, overheads, lags, lateness = [], [], [], []
    published = 0
    cpu0, start = time.process_time(), time.perf_counter()
    first: float | None = None
    started = anyio.Event()
    async with DmsService(config, source=source) as service:
        source.ended = lambda: service.summary.frames.ended

        async def collect() -> None:
            nonlocal published, first
            async for m in service.messages(backlog=10_000):
                source.done()
                if not m.valid:
                    continue
                now_ns = clock_ns()
                first = first or time.perf_counter()
                started.set()
                published += 1
                latency = (now_ns - m.timestamp_sof) / 1e9
                delivered = source.delivered_at.pop(m.frame_id)
                latencies.append(latency)
                overheads.append(now_ns / 1e9 - delivered - m.model_execution_time)
                lateness.append(delivered - m.timestamp_eof / 1e9)

        async def lag() -> None:
            await started.wait()  # steady state: not the model load or the warp planning
            while True:
                t = time.perf_counter()
                await anyio.sleep(0.001)
                lags.append(time.perf_counter() - t - 0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            tg.start_soon(lag)
            await service.finished()
            tg.cancel_scope.cancel()
    wall = time.perf_counter() - (first or start)
    skip = min(5, len(latencies) // 10)  # start-up (model load, first frames) is not the pipeline
    return {
        "fps": published / wall if wall > 0 else 0.0,
        "latency_p50_ms": _p(latencies[skip:], 50) * 1e3,
        "latency_p99_ms": _p(latencies[skip:], 99) * 1e3,
        "overhead_p99_ms": _p(overheads[skip:], 99) * 1e3,
        "late_p99_ms": _p(lateness[skip:], 99) * 1e3,
        "cpu_ms_per_frame": (time.process_time() - cpu0) / max(published, 1) * 1e3,
        "loop_lag_p99_ms": _p(lags, 99) * 1e3,
    }


COLUMNS = (
    "fps",
    "latency_p50_ms",
    "latency_p99_ms",
    "overhead_p99_ms",
    "late_p99_ms",
    "cpu_ms_per_frame",
    "loop_lag_p99_ms",
)


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per 20 Hz round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved 20 Hz rounds")
    parser.add_argument(
        "--max-rounds", type=int, default=5, help="interleaved max-rate rounds (1 s each)"
    )
    args = parser.parse_args()
    print(
        f"onnxruntime {ort.__version__}: intra-op threads {THREADS}, inter-op 1, no spinning; "
        f"{os.cpu_count()} CPUs; service: model thread on CPUs {MODEL_CPUS}, the loop off them; "
        "reference model (untrained)"
    )
    # Each figure is the median over interleaved rounds of the synchronous loop and the service:
    # the machine's speed drifts between runs more than the two loops differ.
    rows: dict[str, dict[str, float | None]] = {}
    for camera in (AR_OX_FISHEYE, OS_FISHEYE):
        size = f"{camera.width}x{camera.height}"
        for fps, label, rounds, frames in (
            (20.0, "20 Hz", args.rounds, int(args.seconds * 20)),
            (None, "max", args.max_rounds, 160),
        ):
            results: dict[str, list[dict[str, Any]]] = {"sync": [], "service": []}
            for number in range(rounds):
                for kind, way in (("sync", run_sync), ("service", _service)):
                    what = f"{kind} {size} {label}, round {number + 1}"
                    if (result := report.attempt(what, way, camera, fps, frames)) is not None:
                        results[kind].append(result)
            for kind, runs in results.items():
                rows[f"{kind} {size} {label}"] = {
                    key: median(r.get(key) for r in runs) for key in COLUMNS
                }
    header = (
        f"{'run':<28} {'fps':>7} {'lat p50':>8} {'lat p99':>8} {'ovh p99':>8} {'late p99':>8} "
        f"{'cpu/fr':>7} {'lag p99':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        print(
            f"{name:<28} {cell(r['fps'], '>7.1f')} {cell(r['latency_p50_ms'], '>8.2f')} "
            f"{cell(r['latency_p99_ms'], '>8.2f')} {cell(r['overhead_p99_ms'], '>8.2f')} "
            f"{cell(r['late_p99_ms'], '>8.2f')} {cell(r['cpu_ms_per_frame'], '>7.2f')} "
            f"{cell(r['loop_lag_p99_ms'], '>8.2f')}"
        )
    big = f"{AR_OX_FISHEYE.width}x{AR_OX_FISHEYE.height}"
    empty: dict[str, float | None] = {}
    sync_fps = rows.get(f"sync {big} max", empty).get("fps")
    service_fps = rows.get(f"service {big} max", empty).get("fps")
    lags = [r["loop_lag_p99_ms"] for n, r in rows.items() if n.startswith("service")]
    lag = max((v for v in lags if v is not None), default=None)
    service_20 = rows.get(f"service {big} 20 Hz", empty)
    overhead = service_20.get("overhead_p99_ms")
    fps_ratio = ratio(service_fps, sync_fps)
    summary = {
        "sync_fps": rounded(sync_fps, 1),
        "service_fps": rounded(service_fps, 1),
        "fps_ratio": rounded(fps_ratio, 3),
        "overhead_p99_ms_20hz": rounded(overhead, 2),
        "latency_p99_ms_20hz": rounded(service_20.get("latency_p99_ms"), 2),
        "sync_latency_p99_ms_20hz": rounded(
            rows.get(f"sync {big} 20 Hz", empty).get("latency_p99_ms"), 2
        ),
        "loop_lag_p99_ms": rounded(lag, 2),
    }
    met = (
        overhead is not None
        and overhead <= TARGETS["overhead_p99_ms_20hz"]
        and fps_ratio is not None
        and fps_ratio >= TARGETS["fps_ratio"]
        and lag is not None
        and lag <= TARGETS["loop_lag_p99_ms"]
    )
    print(f"targets: {TARGETS}")
    report.end(summary, targets_met=met)


def _service(camera: CameraConfig, fps: float | None, frames: int) -> dict[str, Any]:
    return anyio.run(run_service, camera, fps, frames)


if __name__ == "__main__":
    run(main)

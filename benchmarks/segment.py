"""Benchmark: an openpilot route segment (1928x1208 HEVC) replayed — the service beside a plain loop.

A segment is built once (``--frames`` frames, default 200, of a 1928x1208 cabin scene with
sensor noise, HEVC at 10 Mbit/s through PyAV's libx265, its log timing every frame; or
``--segment DIR``, a real one), then replayed in interleaved rounds (``--rounds``, default 3)
two ways, on the CPU:

* ``plain``: one thread, frame after frame, as a script would: decode the next HEVC frame with
  PyAV into NV12 (the same conversion the service's source makes), warp (our ``Warper``), run the
  reference model on onnxruntime (the service's thread settings), decode its outputs;
* ``service``: ``aio-dms replay SEGMENT --device cpu --no-budget`` as ``DmsService`` in this
  process (replay mode: unpaced, nothing dropped), messages read by a subscriber.

Reported per way (medians over the rounds): frames/s over the frames (first frame asked for to last
output: start-up apart), and per frame the HEVC decode (the service's: its source's decoder call,
timed around it), the warp, the model run (the service's: from its messages — the model's run is
``gpuExecutionTime``, the warp ``modelExecutionTime`` less that) and process CPU. The final JSON
line has ``plain_fps``, ``service_fps``, ``service_over_plain`` and each per-frame figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests"))  # the test segment builder

import argparse
import os
import tempfile
import time
from typing import Any

import anyio
import numpy as np

from benchmarks._plain import one_thread_session
from benchmarks._report import Report, cell, median, ratio, rounded, run
from pipelines.dms.config.kinds import CameraFile, DeviceKind, Mode
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames import segment as segments
from pipelines.dms.frames.frame import nv12_layout
from pipelines.dms.frames.video import nv12_from_video
from pipelines.dms.model.contract import load_contract
from pipelines.dms.model.decode import Decoder
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.model.warp import Warper
from pipelines.dms.service import DmsService


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


BITRATE = 10_000_000
"""Bits a second of the built video: openpilot encodes its cameras' full videos at 10 Mbit/s."""


def cabin(position: int, width: int, height: int) -> np.ndarray:
    """A cabin-like luma plane: a lit-from-above gradient, a face-sized bright ellipse moving
    slowly, and sensor noise (sigma 3), which is what makes a real cabin video cost to decode."""
    rows, columns = np.mgrid[0:height, 0:width]
    scene = 50 + 60 * rows / height
    cx, cy = width / 2 + 40 * np.sin(position / 15), height / 2
    face = ((columns - cx) / (0.13 * width)) ** 2 + ((rows - cy) / (0.22 * height)) ** 2 < 1
    scene[face] = 160
    noise = np.random.default_rng(position).normal(0, 3, (height, width))
    return np.clip(scene + noise, 16, 235).astype(np.uint8)


def build(directory: Path, frames: int, keyframe_every: int | None = None) -> Path:
    """A ``frames``-frame 1928x1208 segment of :func:`cabin` at :data:`BITRATE` (a keyframe every
    ``keyframe_every`` frames, else the encoder's choice: here, the first only)."""
    from openpilot_segments import build_segment  # tests/: PyAV's libx265, our schema

    started = time.perf_counter()
    built = build_segment(
        directory / "bench--0",
        frames=frames,
        size=(1928, 1208),
        image=cabin,
        bitrate=BITRATE,
        keyframe_every=keyframe_every,
    )
    video = built.path / "dcamera.hevc"
    print(
        f"built a {frames}-frame 1928x1208 segment in {time.perf_counter() - started:.1f} s "
        f"({video.stat().st_size / frames / 1e3:.0f} kB a frame of HEVC)"
    )
    return built.path


def plain(segment: Path) -> dict[str, float]:
    """Decode, warp, run, decode: one thread, frame after frame."""
    import av

    path = reference_model_path()
    contract = load_contract(path)
    session = one_thread_session(str(path))
    warper, decoder = Warper(), Decoder(contract.output_slices)
    calib = np.zeros((1, 3), np.float32)
    decode_s, warp_s, model_s = [], [], []
    cpu, start = time.process_time(), time.perf_counter()
    with av.open(str(segment / "dcamera.hevc"), format="hevc") as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        frames = container.decode(stream)
        while True:
            t0 = time.perf_counter()
            decoded = next(frames, None)
            if decoded is None:
                break
            buffer, width, height = nv12_from_video(decoded)
            t1 = time.perf_counter()
            img = warper.warp(buffer, width, height, nv12_layout(width, height).stride)
            t2 = time.perf_counter()
            (out,) = session.run(None, {"input_img": img, "calib": calib})
            t3 = time.perf_counter()
            decoder(np.asarray(out).reshape(-1))
            decode_s.append(t1 - t0)
            warp_s.append(t2 - t1)
            model_s.append(t3 - t2)
    count = len(decode_s)
    return {
        "frames": count,
        "fps": count / (time.perf_counter() - start),
        "hevc_decode_ms": _median(decode_s) * 1e3,
        "warp_ms": _median(warp_s) * 1e3,
        "model_ms": _median(model_s) * 1e3,
        "cpu_ms_per_frame": (time.process_time() - cpu) / max(count, 1) * 1e3,
    }


async def _service(segment: Path) -> dict[str, float]:
    decode_s: list[float] = []
    read = segments._Video.read

    def timed_read(video: Any) -> Any:  # the source's decoder call, on its worker thread
        t0 = time.perf_counter()
        try:
            return read(video)
        finally:
            decode_s.append(time.perf_counter() - t0)

    segments._Video.read = timed_read  # type: ignore[method-assign]
    config = ServiceConfig(
        device=DeviceKind.CPU,
        camera=CameraFile(segment),
        mode=Mode.REPLAY,
        no_budget=True,
        health_port=None,
    )
    service = DmsService(config)
    messages = service.messages()  # from the first
    warp_s, model_s = [], []

    async def read_messages() -> None:
        async for message in messages:
            if message.frame_id >= 0:
                model_s.append(message.gpu_execution_time)
                warp_s.append(message.model_execution_time - message.gpu_execution_time)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_messages)  # until the service has closed its sinks
            async with service:
                cpu, start = time.process_time(), time.perf_counter()  # started: model loaded
                await service.finished()
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        segments._Video.read = read  # type: ignore[method-assign]
    count = len(model_s)
    return {
        "frames": count,
        "fps": ratio(count, wall),
        "hevc_decode_ms": _median(decode_s) * 1e3,
        "warp_ms": _median(warp_s) * 1e3,
        "model_ms": _median(model_s) * 1e3,
        "cpu_ms_per_frame": cpu / max(count, 1) * 1e3,
    }


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200, help="frames of the built segment")
    parser.add_argument("--segment", type=Path, help="replay this segment instead of building one")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; one thread each")
    rounds: dict[str, list[dict[str, Any]]] = {"plain": [], "service": []}
    with tempfile.TemporaryDirectory() as tmp:
        segment = args.segment or report.attempt("the segment", build, Path(tmp), args.frames)
        for number in range(args.rounds if segment is not None else 0):
            for way, replay in (("plain", plain), ("service", _replayed)):
                result = report.attempt(f"{way}, round {number + 1}", replay, segment)
                if result is not None:
                    rounds[way].append(result)
    keys = ("fps", "hevc_decode_ms", "warp_ms", "model_ms", "cpu_ms_per_frame")
    medians = {way: {k: median(r[k] for r in runs) for k in keys} for way, runs in rounds.items()}
    frames = {way: int(runs[0]["frames"]) if runs else None for way, runs in rounds.items()}
    header = f"{'way':<8} {'frames':>6} {'frames/s':>9} {'decode ms':>10} {'warp ms':>8} "
    header += f"{'model ms':>9} {'CPU ms/frame':>13}"
    print(header)
    print("-" * len(header))
    for way, m in medians.items():
        print(
            f"{way:<8} {cell(frames[way], '>6')} {cell(m['fps'], '>9.1f')} "
            f"{cell(m['hevc_decode_ms'], '>10.2f')} {cell(m['warp_ms'], '>8.2f')} "
            f"{cell(m['model_ms'], '>9.2f')} {cell(m['cpu_ms_per_frame'], '>13.1f')}"
        )
    summary = {f"{way}_{k}": rounded(v, 3) for way, m in medians.items() for k, v in m.items()}
    summary["service_over_plain"] = rounded(
        ratio(medians["service"]["fps"], medians["plain"]["fps"]), 3
    )
    report.end(summary)


def _replayed(segment: Path) -> dict[str, Any]:
    return anyio.run(_service, segment)


if __name__ == "__main__":
    run(main)

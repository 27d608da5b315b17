"""Benchmark: a fleet replay on Ray beside a plain sequential loop, with one and two workers.

Recordings of our format (the synthetic cabin camera, 1928x1208, compressed as ``aio-dms record``
compresses; one recording written, then copied under each name: every recording costs the same),
``--recordings`` of ``--frames`` frames (the short form, the default: 4 x 150; ``--full``: the
issue's 8 x 1000), replayed three ways on the CPU (onnxruntime, one intra-op thread, no frame
budget — the fleet's defaults):

* ``plain``: one process, one thread, recording after recording, frame after frame: read the
  frame (``RecordingReader``), warp (``Warper``), run the reference model, decode its outputs;
* ``fleet 1w``, ``fleet 2w``: ``run_fleet`` with one, then two workers, on one local Ray cluster
  of 2 CPUs started for both (its start-up reported apart).

Frames/s: the frames over first frame read to last output (plain), over first recording handed
out to last row written (fleet: actor start and each recording's service start included). CPU
milliseconds a frame: the process's (plain); the workers' processes over their replays (from each
recording's summary), and everything else of the cluster's over the run (its other processes —
GCS, raylet, agents — read from ``/proc``, and the driver, this process): the total is what the
ceiling uses. The ceiling for two workers is 2 CPUs / the one-worker run's total CPU a frame.
``per_recording_overhead_s``: what a recording costs beyond its frames in the one-worker run — the
service's start (the recording opened, the model loaded: ``startSeconds``, median) plus the
driver's share between replays ((wall - the replays' seconds) / recordings). ``peak_rss_mb``: the
largest peak resident size (``VmHWM``) of a worker process, sampled as the run goes, and the
driver's. Targets (the issue's): fleet 1w >= 0.9 x plain; fleet 2w >= 0.85 x ceiling and
>= 1.3 x fleet 1w. A table, then one JSON line (``targets``, each one met or not, and
``targets_met``; a way that fails is reported, see :mod:`benchmarks._report`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

import anyio
import numpy as np

from benchmarks._plain import one_thread_session
from benchmarks._report import Report, cell, ratio, run
from pipelines.dms.fleet import (
    FleetCluster,
    FleetOptions,
    FleetProgress,
    find_recordings,
    fleet_config,
    plan_fleet,
    run_fleet,
)
from pipelines.dms.fleet.processes import descendants
from pipelines.dms.frames.recording import FrameRecorder
from pipelines.dms.frames.recording_reader import RecordingReader
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.model.contract import load_contract
from pipelines.dms.model.decode import Decoder
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.model.warp import Warper

_TICKS = os.sysconf("SC_CLK_TCK")
_WORKER = "ray::ReplayWorker"


def write_recordings(folder: Path, recordings: int, frames: int) -> list[Path]:
    first = folder / "drive-0.dmsrec"

    async def made() -> None:
        async with SyntheticCamera("ar_ox_fisheye", fps=1000, frames=frames) as source:
            with FrameRecorder(first) as recorder:
                k = 0
                async for frame in source:
                    sof = 1_000_000_000 + k * 50_000_000  # 20 Hz, as a cabin camera
                    recorder.write(frame.retimed(sof, sof + 20_000_000))
                    k += 1

    started = time.perf_counter()
    anyio.run(made)
    paths = [first]
    for k in range(1, recordings):
        paths.append(folder / f"drive-{k}.dmsrec")
        shutil.copyfile(first, paths[-1])
    size = first.stat().st_size
    print(
        f"wrote {recordings} recordings of {frames} frames ({size / frames / 1e3:.0f} kB a "
        f"frame) in {time.perf_counter() - started:.1f} s"
    )
    return paths


def plain(paths: list[Path]) -> dict[str, float]:
    """Read, warp, run, decode: one thread, frame after frame, recording after recording."""
    path = reference_model_path()
    contract = load_contract(path)
    session = one_thread_session(str(path))
    warper, decoder = Warper(), Decoder(contract.output_slices)
    calib = np.zeros((1, 3), np.float32)
    count = 0
    cpu, start = time.process_time(), time.perf_counter()
    for recording in paths:
        with RecordingReader(recording) as reader:
            for k in range(len(reader)):
                frame = reader.read(k)
                img = warper.warp(frame.buffer, frame.width, frame.height, frame.stride)
                (out,) = session.run(None, {"input_img": img, "calib": calib})
                decoder(np.asarray(out).reshape(-1))
                count += 1
    wall = time.perf_counter() - start
    return {
        "frames": count,
        "fps": count / wall,
        "wall_s": wall,
        "cpu_ms_per_frame": (time.process_time() - cpu) / count * 1e3,
    }


def _cpu_seconds(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _Sampler:
    """Called with the fleet's progress: samples the cluster's processes (CPU, workers' peak
    resident size) while they are there, once a second (a walk of ``/proc`` costs the driver)."""

    def __init__(self) -> None:
        self.cpu: dict[tuple[int, int], float] = {}  # CPU seconds seen, by (pid, start)
        self.workers: set[tuple[int, int]] = set()  # the ones seen as a replay worker
        self.worker_rss = 0.0
        self.sampled = 0.0
        self.sample()
        self.start = dict(self.cpu)  # what each process had used before the run

    def sample(self) -> None:
        self.sampled = time.monotonic()
        for process in descendants():
            key = (process.pid, process.started)
            self.cpu[key] = _cpu_seconds(process.pid)
            if process.command.startswith(_WORKER):
                self.workers.add(key)
                self.worker_rss = max(self.worker_rss, _peak_rss_mb(process.pid))

    def __call__(self, news: FleetProgress) -> None:
        del news
        if time.monotonic() - self.sampled >= 1.0:
            self.sample()

    def other_cpu(self) -> float:
        """CPU seconds the processes other than the replay workers used over the run."""
        self.sample()
        return sum(
            used - self.start.get(key, 0.0)
            for key, used in self.cpu.items()
            if key not in self.workers
        )


def fleet(paths: list[Path], cluster: FleetCluster, workers: int, out: Path) -> dict[str, float]:
    plan = plan_fleet(find_recordings(paths), FleetOptions(out, fleet_config(), workers=workers))
    sampler = _Sampler()
    driver_cpu = time.process_time()
    result = run_fleet(plan, cluster=cluster, progress=sampler)
    driver_cpu = time.process_time() - driver_cpu
    other = sampler.other_cpu()
    summaries = result.recordings
    if not all(s["status"] == "complete" for s in summaries):
        raise RuntimeError(f"recordings failed: {result.summary['failures']}")
    frames = sum(s["frames"] for s in summaries)
    if result.first_handed_out is None or result.last_row_written is None:
        raise RuntimeError("no recording was handed out, or no row written")
    wall = result.last_row_written - result.first_handed_out
    worker_cpu = sum(s["cpuSeconds"] or 0.0 for s in summaries)
    replaying = sum(s["replaySeconds"] or 0.0 for s in summaries)
    starts = [s["startSeconds"] for s in summaries if s["startSeconds"] is not None]
    return {
        "frames": frames,
        "fps": frames / wall,
        "wall_s": wall,
        "cpu_ms_per_frame_workers": worker_cpu / frames * 1e3,
        "cpu_ms_per_frame_other": (other + driver_cpu) / frames * 1e3,
        "cpu_ms_per_frame": (worker_cpu + other + driver_cpu) / frames * 1e3,
        "per_recording_overhead_s": statistics.median(starts)
        + max(wall * workers - replaying, 0.0) / len(summaries),
        "service_start_s": statistics.median(starts),
        "worker_peak_rss_mb": sampler.worker_rss,
    }


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the issue's form: 8 x 1000 frames")
    parser.add_argument("--recordings", type=int, help="recordings (default 4; --full 8)")
    parser.add_argument("--frames", type=int, help="frames a recording (default 150; --full 1000)")
    args = parser.parse_args()
    recordings = args.recordings or (8 if args.full else 4)
    frames = args.frames or (1000 if args.full else 150)
    form = "full" if (recordings, frames) == (8, 1000) else "short"
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {form} form")
    ways: dict[str, dict[str, float]] = {}
    startup: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_recordings(folder, recordings, frames)
        if (alone := report.attempt("plain", plain, paths)) is not None:
            ways["plain"] = alone

        def on_a_cluster() -> None:
            nonlocal startup
            with FleetCluster(None, 2, folder / "ray") as cluster:
                startup = cluster.start_seconds or 0.0
                for workers in (1, 2):
                    name, out = f"fleet {workers}w", folder / f"run-{workers}w"
                    if (
                        way := report.attempt(name, fleet, paths, cluster, workers, out)
                    ) is not None:
                        ways[name] = way

        report.attempt("the local cluster", on_a_cluster)
    driver_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    one, two, alone = ways.get("fleet 1w", {}), ways.get("fleet 2w", {}), ways.get("plain", {})
    ceiling = ratio(2, None if "cpu_ms_per_frame" not in one else one["cpu_ms_per_frame"] / 1e3)
    print(f"\n{'way':<10} {'frames':>7} {'frames/s':>9} {'wall s':>7} {'CPU ms/frame':>13} "
          f"{'workers':>8} {'Ray+driver':>11}")  # fmt: skip
    for way, r in ways.items():
        print(
            f"{way:<10} {r['frames']:>7.0f} {cell(r['fps'], '>9.1f')} {r['wall_s']:>7.1f} "
            f"{cell(r['cpu_ms_per_frame'], '>13.2f')} "
            f"{cell(r.get('cpu_ms_per_frame_workers'), '>8.2f')} "
            f"{cell(r.get('cpu_ms_per_frame_other'), '>11.2f')}"
        )
    peaks = [r["worker_peak_rss_mb"] for r in (one, two) if "worker_peak_rss_mb" in r]
    print(
        f"Ray start-up {cell(startup, '.1f')} s; ceiling for 2 workers {cell(ceiling, '.1f')} "
        f"frames/s (2 CPUs / {cell(one.get('cpu_ms_per_frame'), '.2f')} ms); per-recording "
        f"overhead {cell(one.get('per_recording_overhead_s'), '.2f')} s (service start "
        f"{cell(one.get('service_start_s'), '.2f')} s); worker peak RSS "
        f"{cell(max(peaks, default=None), '.0f')} MB, driver {driver_rss:.0f} MB"
    )
    ratios = {
        "fleet_1w_over_plain": ratio(one.get("fps"), alone.get("fps")),
        "fleet_2w_over_ceiling": ratio(two.get("fps"), ceiling),
        "fleet_2w_over_fleet_1w": ratio(two.get("fps"), one.get("fps")),
    }
    limits = {
        "fleet_1w_ge_0.9_plain": ("fleet_1w_over_plain", 0.9),
        "fleet_2w_ge_0.85_ceiling": ("fleet_2w_over_ceiling", 0.85),
        "fleet_2w_ge_1.3_fleet_1w": ("fleet_2w_over_fleet_1w", 1.3),
    }
    targets = {
        name: (value := ratios[key]) is not None and value >= limit
        for name, (key, limit) in limits.items()
    }
    for (name, met), value in zip(targets.items(), ratios.values(), strict=True):
        print(f"target {name}: {'PASS' if met else 'MISS'} ({cell(value, '.2f')})")
    result: dict[str, Any] = {
        "benchmark": "fleet",
        "form": form,
        "recordings": recordings,
        "frames_per_recording": frames,
        "plain_fps": alone.get("fps"),
        "fleet_1w_fps": one.get("fps"),
        "fleet_2w_fps": two.get("fps"),
        "cpu_ms_per_frame_plain": alone.get("cpu_ms_per_frame"),
        "cpu_ms_per_frame_1w": one.get("cpu_ms_per_frame"),
        "cpu_ms_per_frame_1w_workers": one.get("cpu_ms_per_frame_workers"),
        "cpu_ms_per_frame_2w": two.get("cpu_ms_per_frame"),
        "ceiling_2w_fps": ceiling,
        "ray_startup_s": startup,
        "per_recording_overhead_s": one.get("per_recording_overhead_s"),
        "service_start_s": one.get("service_start_s"),
        "peak_rss_mb": max(peaks, default=None),
        "driver_peak_rss_mb": driver_rss,
        **ratios,
        "targets": targets,
    }
    report.end(result, targets_met=all(targets.values()))


if __name__ == "__main__":
    run(main)

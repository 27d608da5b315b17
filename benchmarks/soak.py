"""Soak: the DMS service on the simulated accelerator under random, overlapping faults, in virtual
time — far faster than real time — checking that nothing is lost, nothing hangs, nothing leaks.

The service runs as ``aio-dms run --device sim`` does, on the synthetic camera, with the model of
the same contract made cheap: the simulated GPU's kernel hands back the bundled reference
model's output for one frame, computed once (the warp, the copies over the simulated bridge, the
kernel, the timeline and the copy-out all run for every frame). Under
:func:`aio_runtime.testing.virtual_time` with ``hold=threads_busy()``, work on threads takes no
virtual time: every instant is set by the timers (see :data:`GRACE`).

Faults (seeded: ``--seed``): the accelerator's — gpu-hang, usb-timeout, usb-disconnect,
fence-stall, smu-timeout — in clusters of one to three overlapping kinds, each cluster once the
service is AVAILABLE again after the last one, plus as many more struck the moment a session
starts reopening (a kind not already active, the least struck first); and the service's own —
camera-stall and nan-output — scripted by frame number. Reported: frames received, valid,
invalid, dropped; unaccounted frames (received - published - dropped, published counted by a
subscriber of its own); hangs (a published frame older than ``HANG_BOUND`` seconds, no frame
published for that long while frames arrive, or the service not AVAILABLE again within
``RECOVERY_BOUND`` of a cluster's end); RSS, threads and file descriptors sampled every 1 % of
the run; per fault kind, fault -> UNAVAILABLE and end of fault -> AVAILABLE (virtual seconds;
the latter for each cluster, under the kind that ended last, with how many exceeded the target of
1 s plus the mode-1 reset pause where the recovering boot needed one).

Exit status 1 when unaccounted or hangs is not 0, RSS grew by more than 5 MB, or the file
descriptors or threads grew at all between 10 % and 100 % of the run — or when the soak itself
failed (reported with the table and the JSON line all the same, see :mod:`benchmarks._report`).
Final JSON line with ``frames``, ``unaccounted``, ``hangs``, ``rss_growth_mb``, ``fds_growth``,
``threads_growth``, and the rest. ``--frames``: 5 000 by default (the form ``make bench`` runs);
the long form is ``--frames 100000`` or more.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from aio_runtime import Ledger, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from benchmarks._report import Report
from benchmarks._report import run as run_benchmark
from benchmarks._soak import DEVICE_KINDS, SERVICE_KINDS, Latencies, Soak
from pipelines.dms.backends.cpu import OnnxRunner
from pipelines.dms.backends.sim import simulated_device
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.model.contract import load_contract
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.model.warp import MODEL_INPUT_SIZE
from pipelines.dms.service import DmsService
from transports.sim import FaultPlan
from transports.sim.usb import SimUsbTransport

__all__ = ["DEVICE_KINDS", "Latencies", "SoakResult", "failures", "main", "report", "run_soak"]

GRACE = 0.001
"""Real seconds the loop waits for a thread's wake-up before a jump (see
tests/test_dms_service_virtual_time.py, which waits 5 ms: a soak makes hundreds of thousands of
jumps). A wake-up later than that (a loaded machine) is seen one jump late: the run is then not
the same as the last to the instant, though its faults come in the same order."""


@dataclass
class SoakResult:
    frames: int
    received: int
    valid: int
    invalid: int
    dropped: int
    published: int
    hangs: int
    leaked: int
    """Ledger entries (transfers, threads, mappings) still live once the service had stopped."""
    samples: list[tuple[int, float, int, int]]
    """(frame, RSS MB, threads, fds) every 1 % of the run."""
    latencies: Latencies
    virtual_s: float
    real_s: float
    kept: dict[str, int] = field(default_factory=dict)
    """What the service's summary holds at the end (frame ages, availability transitions)."""

    @property
    def unaccounted(self) -> int:
        return self.received - self.published - self.dropped

    def growth(self, column: int) -> float:
        """Growth of a sample column (1 RSS, 2 threads, 3 fds) from 10 % of the run to its end."""
        if len(self.samples) < 2:
            return 0.0
        base = min(self.samples, key=lambda s: abs(s[0] - self.frames / 10))
        return self.samples[-1][column] - base[column]


def cheap_infer(model: Path) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The reference model's output for a blank frame, computed once: a model of the same
    contract that costs nothing to run."""
    runner = OnnxRunner(model)
    try:
        output = runner.run_blocking(
            np.zeros((1, MODEL_INPUT_SIZE), np.uint8), np.zeros((1, 3), np.float32)
        )
    finally:
        runner.close()
    return lambda img, calib: output.copy()


async def run_soak(frames: int, seed: int, *, progress: list[int] | None = None) -> SoakResult:
    """Run the service for ``frames`` frames under the seeded faults; what was found.
    ``progress[0]``, if given, follows the frames that have arrived."""
    model = reference_model_path()
    contract = load_contract(model)
    infer = cheap_infer(model)
    soak = Soak(frames, seed, progress=progress)
    config = ServiceConfig(
        device="sim", health_port=None, calib=(0.0, 0.0, 0.0), frames=frames, faults=soak.script
    )
    real_start = time.perf_counter()
    ledger = Ledger()
    with use_ledger(ledger):
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)) as clock:
            start = clock.now()
            soak.plan = FaultPlan()
            async with simulated_device(
                infer,
                image_size=MODEL_INPUT_SIZE,
                output_size=contract.output_length,
                plan=soak.plan,
            ) as sim:
                soak.gpu = sim.gpu

                async def transport() -> SimUsbTransport:
                    return SimUsbTransport(sim.bridge)

                async with anyio.create_task_group() as meters:
                    soak.service = DmsService(
                        config, source=soak.camera(meters), transport=transport
                    )
                    async with soak.service as service:
                        meters.start_soon(soak.follow_messages)
                        meters.start_soon(soak.follow_availability)
                        meters.start_soon(soak.drive)
                        await service.finished()
                        meters.cancel_scope.cancel()
            virtual = clock.now() - start
    counts = soak.service.summary.frames
    return SoakResult(
        frames=frames,
        received=counts.received,
        valid=counts.valid,
        invalid=sum(counts.invalid.values()),
        dropped=sum(counts.dropped.values()),
        published=soak.published,
        hangs=soak.hangs,
        leaked=len(ledger.live()),
        samples=soak.samples,
        latencies=soak.lat,
        virtual_s=virtual,
        real_s=time.perf_counter() - real_start,
        kept={
            "frame_ages": len(soak.service.summary.frame_ages),
            "transitions": len(soak.service.summary.transitions),
        },
    )


def _quantiles(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7}"
    return f"{statistics.median(values):7.3f} {np.percentile(values, 99):7.3f} {max(values):7.3f}"


def report(result: SoakResult) -> dict[str, Any]:
    """Print the table; the final JSON line's content."""
    lat = result.latencies
    print(
        f"soak: {result.frames} frames, {result.virtual_s:.0f} s of virtual time in "
        f"{result.real_s:.0f} s ({result.frames / result.real_s:.0f} frames/s, "
        f"{result.virtual_s / result.real_s:.1f}x real time)"
    )
    print(
        f"frames: received {result.received}, valid {result.valid}, invalid {result.invalid}, "
        f"dropped {result.dropped}, published {result.published}; "
        f"unaccounted {result.unaccounted}; hangs {result.hangs}; leaked {result.leaked}"
    )
    print(
        f"{'fault':<15} {'struck':>6} {'reopen':>6}  {'-> unavailable (s) p50 p99 max':>31}"
        f"  {'end -> available (s) p50 p99 max':>33} {'n':>4} {'over':>4}"
    )
    for kind in (*DEVICE_KINDS, *SERVICE_KINDS):
        print(
            f"{kind:<15} {lat.struck[kind]:6d} {lat.during_reopen[kind]:6d}  "
            f"{_quantiles(lat.unavailable[kind]):>31}  {_quantiles(lat.available[kind]):>33} "
            f"{len(lat.available[kind]):4d} {lat.over_target[kind]:4d}"
        )
    for story in lat.slow:
        print(f"slow recovery, {story}")
    first = min(result.samples, key=lambda s: abs(s[0] - result.frames / 10))
    last = result.samples[-1]
    print(
        f"process at 10 % / end: RSS {first[1]:.1f} / {last[1]:.1f} MB, threads {first[2]} / "
        f"{last[2]}, fds {first[3]} / {last[3]}; the service's summary keeps "
        f"{result.kept.get('frame_ages', 0)} frame ages (bounded) and "
        f"{result.kept.get('transitions', 0)} availability transitions"
    )

    def stats(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        return {
            kind: {"median": statistics.median(v), "max": max(v), "n": len(v)}
            for kind, v in values.items()
            if v
        }

    return {
        "frames": result.frames,
        "received": result.received,
        "valid": result.valid,
        "invalid": result.invalid,
        "dropped": result.dropped,
        "published": result.published,
        "unaccounted": result.unaccounted,
        "hangs": result.hangs,
        "leaked": result.leaked,
        "rss_growth_mb": round(result.growth(1), 2),
        "threads_growth": int(result.growth(2)),
        "fds_growth": int(result.growth(3)),
        "virtual_s": round(result.virtual_s, 1),
        "real_s": round(result.real_s, 1),
        "frames_per_s": round(result.frames / result.real_s, 1),
        "struck": dict(lat.struck),
        "struck_during_reopen": dict(lat.during_reopen),
        "fault_to_unavailable_s": stats(lat.unavailable),
        "end_to_available_s": stats(lat.available),
        "recoveries_over_target": dict(lat.over_target),
        "summary_kept": result.kept,
    }


def failures(summary: dict[str, Any]) -> list[str]:
    """Why the run failed (empty: it passed)."""
    problems = [
        f"{key} = {summary[key]}" for key in ("unaccounted", "hangs", "leaked") if summary[key]
    ]
    if summary["rss_growth_mb"] > 5:
        problems.append(f"RSS grew {summary['rss_growth_mb']} MB (over 5 MB)")
    problems += [
        f"{key} = {summary[key]}" for key in ("fds_growth", "threads_growth") if summary[key] > 0
    ]
    return problems


def _watchdog(soak_progress: Callable[[], int], limit: float) -> None:
    """Ends the process if the run stops making progress in real time (a hang the service's
    own clock cannot see: the loop itself stuck)."""
    seen, since = -1, time.monotonic()
    while True:
        time.sleep(1.0)
        progress = soak_progress()
        if progress != seen:
            seen, since = progress, time.monotonic()
        elif time.monotonic() - since > limit:
            why = f"no progress for {limit:.0f} s of real time: hung"
            print(f"soak: {why}", file=sys.stderr)
            print(json.dumps({"frames": progress, "hangs": 1, "failed": {"soak": why}}), flush=True)
            os._exit(1)


def main(outcome: Report, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=5_000, help="frames (long form: 100000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the faults (default 1)")
    parser.add_argument(
        "--stall-limit", type=float, default=120.0, help="real seconds without progress: hung"
    )
    args = parser.parse_args(argv)
    if args.frames < 500:
        parser.error("--frames must be at least 500")
    progress = [0]
    threading.Thread(
        target=_watchdog, args=(lambda: progress[0], args.stall_limit), daemon=True
    ).start()

    async def run() -> SoakResult:
        return await run_soak(args.frames, args.seed, progress=progress)

    result = outcome.attempt("soak", anyio.run, run)
    if result is None:
        outcome.end({"frames": progress[0], "hangs": None}, targets_met=False)
        return 1
    summary = report(result)
    problems = failures(summary)
    for problem in problems:
        print(f"FAILED: {problem}")
    outcome.end(summary, targets_met=not problems)
    return 1 if problems else 0


if __name__ == "__main__":
    run_benchmark(main)

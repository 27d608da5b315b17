"""``aio-dms run``: the DMS service from the command line, with a summary at the end."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from aio_runtime import configure_logging

from .faults import FAULT_NAMES
from .service import DmsService, ServiceConfig, Summary

__all__ = ["add_arguments", "run"]

_DEFAULTS = ServiceConfig()


def _calib(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--calib {text!r}: expected R,P,Y (three numbers)"
        ) from None
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"--calib {text!r}: expected three finite numbers R,P,Y")
    return values[0], values[1], values[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    parser.add_argument(
        "--camera", default=d.camera, help="synthetic, a video file, or a recording"
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="an ONNX model (default: the bundled, untrained reference)",
    )
    parser.add_argument(
        "--device",
        choices=("sim", "cpu"),
        default=d.device,
        help="sim: the simulated accelerator; cpu: onnxruntime",
    )
    parser.add_argument(
        "--faults",
        default="",
        help="comma-separated NAME@FRAME[+FRAMES], e.g. gpu-hang@40+20; names: "
        + ", ".join(FAULT_NAMES),
    )
    parser.add_argument("--frames", type=int, default=None, help="stop after N frames")
    parser.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    parser.add_argument(
        "--jsonl", default=None, metavar="PATH|-", help="write messages as JSON lines"
    )
    parser.add_argument(
        "--zmq",
        default=None,
        metavar="ADDRESS",
        help="publish on ZeroMQ (loopback), e.g. tcp://127.0.0.1:9031",
    )
    parser.add_argument(
        "--calib",
        type=_calib,
        default=None,
        metavar="R,P,Y",
        help="a static calibration (default: the synthetic stream)",
    )
    parser.add_argument("--raw-predictions", action="store_true", help="include rawPredictions")
    parser.add_argument("--log-format", choices=("console", "json"), default="console")
    parser.add_argument(
        "--budget", type=float, default=d.budget, help=f"seconds per frame (default {d.budget})"
    )
    parser.add_argument(
        "--unavailable-after",
        type=int,
        default=d.unavailable_after,
        help="frames in a row without a valid output before UNAVAILABLE "
        f"(default {d.unavailable_after})",
    )
    parser.add_argument(
        "--gpu-hang-after",
        type=float,
        default=d.gpu_hang_after,
        help="seconds the accelerator may hold a kernel without progress before it counts as "
        f"hung and is restarted (default {d.gpu_hang_after})",
    )
    parser.add_argument(
        "--recover-after",
        type=int,
        default=d.recover_after,
        help=f"good frames before AVAILABLE again (default {d.recover_after})",
    )
    parser.add_argument(
        "--backoff",
        type=float,
        nargs=2,
        default=(d.backoff_initial, d.backoff_max),
        metavar=("FIRST", "MAX"),
        help="accelerator restart backoff, seconds",
    )
    parser.add_argument(
        "--calib-stale-after",
        type=float,
        default=d.calib_stale_after,
        help=f"seconds (default {d.calib_stale_after})",
    )
    parser.add_argument(
        "--camera-stall-after",
        type=float,
        default=d.camera_stall_after,
        help=f"seconds (default {d.camera_stall_after})",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=d.health_port,
        help=f"health and metrics on 127.0.0.1 (default {d.health_port}; 0: any free port; -1: off)",
    )
    parser.add_argument(
        "--threads", type=int, default=d.intra_op_threads, help="onnxruntime intra-op threads"
    )
    parser.add_argument(
        "--model-cpus",
        default="auto",
        metavar="auto|none|N,N...",
        help="CPUs for the model's thread with --device cpu, the event loop kept off them "
        "(auto: the last CPU, when there are two or more)",
    )


def _config(args: argparse.Namespace) -> ServiceConfig:
    return ServiceConfig(
        camera=args.camera,
        model=args.model,
        device=args.device,
        budget=args.budget,
        recover_after=args.recover_after,
        gpu_hang_after=args.gpu_hang_after,
        unavailable_after=args.unavailable_after,
        backoff_initial=args.backoff[0],
        backoff_max=args.backoff[1],
        calib=args.calib,
        calib_stale_after=args.calib_stale_after,
        camera_stall_after=args.camera_stall_after,
        health_port=None if args.health_port < 0 else args.health_port,
        zmq=args.zmq,
        jsonl=args.jsonl,
        raw_predictions=args.raw_predictions,
        frames=args.frames,
        duration=args.duration,
        faults=args.faults,
        intra_op_threads=args.threads,
        model_cpus=_model_cpus(args.model_cpus, args.device),
    )


def _model_cpus(spec: str, device: str) -> tuple[int, ...] | None:
    if spec == "none" or device != "cpu" or not hasattr(os, "sched_getaffinity"):
        return None  # (CPU placement is Linux's)
    if spec == "auto":
        available = sorted(os.sched_getaffinity(0))
        return (available[-1],) if len(available) >= 2 else None
    try:
        return tuple(int(cpu) for cpu in spec.split(","))
    except ValueError:
        raise ValueError(
            f"--model-cpus: expected auto, none or CPU numbers, got {spec!r}"
        ) from None


def format_summary(summary: Summary) -> str:
    frames = summary.frames
    lines = [
        "",
        "summary",
        f"  frames received      {frames.received}",
        f"  published valid      {frames.valid}",
        f"  published invalid    {sum(frames.invalid.values())}",
    ]
    for reason, count in frames.invalid.most_common():
        lines.append(f"    {count:5d}  {reason[:100]}")
    lines.append(f"  dropped              {sum(frames.dropped.values())}")
    for stage, count in sorted(frames.dropped.items()):
        lines.append(f"    {count:5d}  at {stage}")
    lines.append(
        "  frame age ms         "
        f"p50 {summary.latency_ms(50):.1f}  p99 {summary.latency_ms(99):.1f}  "
        f"max {summary.latency_ms(100):.1f}"
    )
    lines.append("  availability")
    start = summary.transitions[0][0] if summary.transitions else 0.0
    for when, state in summary.transitions:
        lines.append(f"    {when - start:8.3f} s  {state[:110]}")
    return "\n".join(lines)


def run(args: argparse.Namespace, *, out: Any = None) -> int:
    configure_logging(args.log_format, stream=sys.stderr)
    try:
        config = _config(args)
    except ValueError as exc:
        print(f"aio-dms run: {exc}", file=sys.stderr)
        return 2

    async def main() -> Summary:
        async with DmsService(config) as service:
            async with anyio.create_task_group() as tg:

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(stop_on_signal)
                await service.finished()
                tg.cancel_scope.cancel()
            return service.summary

    summary = anyio.run(main)
    summary.frames.check()
    print(format_summary(summary), file=out or sys.stdout)
    if summary.camera_error is not None:
        print(f"aio-dms run: the camera failed: {summary.camera_error}", file=sys.stderr)
        return 1
    return 0

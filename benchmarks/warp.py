"""Benchmark: warping a cabin camera frame's luma plane to the DMS model's 1440x960 input.

For both cabin cameras — the 1928x1208 one (the warp is an integer crop) and the 1344x760 one (a
0.75 scale plus offset, 98 border rows) — side by side, in one run, round by round so machine noise
hits every variant alike, all on one thread:

* ``warper`` — :class:`pipelines.dms.model.warp.Warper`: a slice copy for the crop, precomputed source
  indices and one gather otherwise (openpilot-exact: round half to even, border 16);
* ``cv2``    — ``cv2.warpPerspective`` nearest with a constant border of 16 and
  ``cv2.setNumThreads(1)``. Not part of the contract: OpenCV computes coordinates in float64
  (openpilot in float32) and its rounding is an implementation detail; the table counts the pixels
  where it disagrees with the warper (0 for both cabin cameras with OpenCV 5.0, whose nearest
  rounds .5 ties to even here too);
* ``naive``  — numpy recomputing the mapping every frame (coordinates, rounding, mask, gather).

Frames are whole NV12 buffers with the real strides, a few distinct ones in rotation. Prints a
table (median and p99 ms per frame, ratio to the warper), then one JSON line with
``warp_crop_ms_p50``, ``warp_crop_ms_p99``, ``warp_1344_ms_p50``, ``warp_1344_ms_p99`` (and the
same for ``cv2_`` and ``naive_``), the ratios, and ``targets_met``. Targets, per frame at p99:
<= 1 ms for the crop camera, <= 3 ms for the 1344x760 camera. A run that fails is reported, see
:mod:`benchmarks._report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import time
from collections.abc import Callable

import cv2
import numpy as np
from numpy.typing import NDArray

from benchmarks._report import Report, cell, ratio, rounded, run
from pipelines.dms.model.warp import (
    BORDER_VALUE,
    MODEL_INPUT_HEIGHT,
    MODEL_INPUT_SIZE,
    MODEL_INPUT_WIDTH,
    Warper,
    cabin_intrinsics,
    warp_matrix,
)

# name -> (width, height, stride, NV12 buffer size), spec/dms-contract.md §1.5
CAMERAS = {"crop": (1928, 1208, 2048, 4_804_608), "1344": (1344, 760, 1408, 2_428_928)}
TARGETS_MS_P99 = {"crop": 1.0, "1344": 3.0}
VARIANTS = ("warper", "cv2", "naive")
FRAMES_IN_ROTATION = 4

Frame = NDArray[np.uint8]
Warp = Callable[[Frame, NDArray[np.uint8]], None]


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def make_frames(width: int, height: int, stride: int, size: int) -> list[Frame]:
    rng = np.random.default_rng(width)
    return [rng.integers(0, 256, size=size, dtype=np.uint8) for _ in range(FRAMES_IN_ROTATION)]


def luma(frame: Frame, width: int, height: int, stride: int) -> NDArray[np.uint8]:
    return frame[: height * stride].reshape(height, stride)[:, :width]


def make_variants(width: int, height: int, stride: int) -> dict[str, Warp]:
    warper = Warper()
    matrix = warp_matrix(cabin_intrinsics(width, height))

    def ours(frame: Frame, out: NDArray[np.uint8]) -> None:
        warper.warp(frame, width, height, stride, out=out)

    def opencv(frame: Frame, out: NDArray[np.uint8]) -> None:
        cv2.warpPerspective(
            luma(frame, width, height, stride),
            matrix,
            (MODEL_INPUT_WIDTH, MODEL_INPUT_HEIGHT),
            dst=out.reshape(MODEL_INPUT_HEIGHT, MODEL_INPUT_WIDTH),
            flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=BORDER_VALUE,
        )

    def naive(frame: Frame, out: NDArray[np.uint8]) -> None:
        xs, ys = np.meshgrid(
            np.arange(MODEL_INPUT_WIDTH, dtype=np.float32),
            np.arange(MODEL_INPUT_HEIGHT, dtype=np.float32),
        )
        w = matrix[2, 0] * xs + matrix[2, 1] * ys + matrix[2, 2]
        columns = np.rint((matrix[0, 0] * xs + matrix[0, 1] * ys + matrix[0, 2]) / w)
        rows = np.rint((matrix[1, 0] * xs + matrix[1, 1] * ys + matrix[1, 2]) / w)
        inside = (columns >= 0) & (columns <= width - 1) & (rows >= 0) & (rows <= height - 1)
        index = np.where(inside, rows * stride + columns, 0).astype(np.intp)
        out[...] = np.where(inside, frame[index], BORDER_VALUE).reshape(1, -1)

    return {"warper": ours, "cv2": opencv, "naive": naive}


def time_frames(warp: Warp, frames: list[Frame], out: NDArray[np.uint8], count: int) -> list[float]:
    samples = []
    for i in range(count):
        frame = frames[i % len(frames)]
        start = time.perf_counter()
        warp(frame, out)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def warps(rounds: int, per_round: int, naive_per_round: int) -> dict[str, dict[str, float | None]]:
    cv2.setNumThreads(1)
    setups = {}
    for camera, (width, height, stride, size) in CAMERAS.items():
        frames = make_frames(width, height, stride, size)
        variants = make_variants(width, height, stride)
        outputs = {name: np.empty((1, MODEL_INPUT_SIZE), np.uint8) for name in variants}
        for name, warp in variants.items():  # warm up (the warper builds its plan here)
            warp(frames[0], outputs[name])
        if not np.array_equal(outputs["warper"], outputs["naive"]):
            raise RuntimeError(f"{camera}: the warper and the naive warp disagree")
        mismatch = int(np.count_nonzero(outputs["warper"] != outputs["cv2"]))
        setups[camera] = (frames, variants, outputs, mismatch)

    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for camera, (frames, variants, outputs, _) in setups.items():
            for name, warp in variants.items():
                count = naive_per_round if name == "naive" else per_round
                samples.setdefault((camera, name), []).extend(
                    time_frames(warp, frames, outputs[name], count)
                )
    results: dict[str, dict[str, float | None]] = {}
    for camera, (*_, mismatch) in setups.items():
        for name in VARIANTS:
            values = samples.get((camera, name), [])
            results[f"{camera}/{name}"] = {
                "p50": percentile(values, 50),
                "p99": percentile(values, 99),
                "samples": len(values),
                "cv2_mismatch_px": mismatch,
            }
    return results


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--naive-per-round", type=int, default=3)
    args = parser.parse_args()
    results = report.attempt("the warps", warps, args.rounds, args.per_round, args.naive_per_round)
    results = results or {}

    print(f"one thread (cv2.setNumThreads(1)); {FRAMES_IN_ROTATION} frames in rotation per camera")
    header = (
        f"{'camera':<10} {'variant':<8} {'p50 ms':>8} {'p99 ms':>8} {'x warper p50':>13} "
        f"{'samples':>8}"
    )
    print(header)
    print("-" * len(header))
    summary: dict[str, float | int | bool | None] = {}
    for camera, (width, height, _, _) in CAMERAS.items():
        ours = results.get(f"{camera}/warper", {})
        for name in VARIANTS:
            r = results.get(f"{camera}/{name}", {})
            print(
                f"{f'{width}x{height}':<10} {name:<8} {cell(r.get('p50'), '>8.3f')} "
                f"{cell(r.get('p99'), '>8.3f')} {cell(ratio(r.get('p50'), ours.get('p50')), '>13.2f')} "
                f"{cell(r.get('samples'), '>8')}"
            )
            prefix = "warp" if name == "warper" else name
            summary[f"{prefix}_{camera}_ms_p50"] = rounded(r.get("p50"), 4)
            summary[f"{prefix}_{camera}_ms_p99"] = rounded(r.get("p99"), 4)
        for name in ("cv2", "naive"):
            other = results.get(f"{camera}/{name}", {}).get("p50")
            summary[f"ratio_{camera}_vs_{name}"] = rounded(ratio(ours.get("p50"), other), 3)
        mismatch = ours.get("cv2_mismatch_px")
        summary[f"cv2_{camera}_mismatch_px"] = None if mismatch is None else int(mismatch)
        summary[f"target_{camera}_ms_p99"] = TARGETS_MS_P99[camera]
        print(
            f"{'':<10} {'target':<8} {'':>8} {TARGETS_MS_P99[camera]:>8.3f}   "
            f"(cv2 differs from the warper on {cell(mismatch, '')} pixels)"
        )
    missed = [
        c
        for c, limit in TARGETS_MS_P99.items()
        if (p99 := summary[f"warp_{c}_ms_p99"]) is None or p99 > limit
    ]
    print(f"targets missed by the warper: {', '.join(missed) if missed else 'none'}")
    print(
        "ratios (warper / other, p50): "
        + ", ".join(f"{k} = {cell(v, '')}" for k, v in summary.items() if k.startswith("ratio_"))
    )
    report.end(summary, targets_met=not missed)


if __name__ == "__main__":
    run(main)

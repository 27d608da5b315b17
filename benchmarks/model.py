"""Benchmark: the reference DMS model on onnxruntime's CPU provider.

Measured, in one run:

* ``build_ms``: building the reference model's bytes in memory (weights from the fixed seed, graph,
  metadata, checker) — what :func:`reference_model_path` does on every call before it finds the
  cached file; ``path_first_ms`` / ``path_cached_ms``: :func:`reference_model_path` into an empty
  folder / once the file is there;
* ``session_ms``: creating an onnxruntime session for it;
* per intra-op thread count (1 and 2), interleaved round by round so machine noise hits both alike:
  ``direct_<n>t_ms``: ``InferenceSession.run`` on the calling thread, median and p90;
  ``runner_<n>t_ms``: :meth:`OnnxRunner.run` from an asyncio task — the same plus copying the inputs
  in, the worker thread hand-off and copying the output out.

Prints a table, then one JSON line (with ``macs``: multiply-adds per run). A step that fails is
reported, see :mod:`benchmarks._report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import functools
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]

from benchmarks._report import Report, cell, median, run
from pipelines.dms.backends.cpu import OnnxRunner
from pipelines.dms.model.reference import (
    build_reference_model,
    reference_model_macs,
    reference_model_path,
)

THREADS = (1, 2)


def ms(seconds: list[float], q: float = 0.5) -> float | None:
    if not seconds:
        return None
    ordered = sorted(seconds)
    return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def measure(path: Path, rounds: int) -> dict[str, float | None]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (960, 1440), dtype=np.uint8)
    calib = np.zeros(3, dtype=np.float32)
    feeds = {"input_img": image.reshape(1, -1), "calib": calib.reshape(1, 3)}
    sessions: dict[int, ort.InferenceSession] = {}
    runners: dict[int, OnnxRunner] = {}
    for n in THREADS:
        options = ort.SessionOptions()
        options.intra_op_num_threads = n
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[n] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runners[n] = OnnxRunner(path, intra_op_threads=n)
    direct: dict[int, list[float]] = {n: [] for n in THREADS}
    runner: dict[int, list[float]] = {n: [] for n in THREADS}
    for warm in range(rounds + 5):
        for n in THREADS:
            d = timed(functools.partial(sessions[n].run, None, feeds))
            start = time.perf_counter()
            await runners[n].run(image, calib, timeout=1.0)
            r = time.perf_counter() - start
            if warm >= 5:
                direct[n].append(d)
                runner[n].append(r)
    result: dict[str, float | None] = {}
    for n in THREADS:
        result[f"direct_{n}t_ms_p50"] = ms(direct[n])
        result[f"direct_{n}t_ms_p90"] = ms(direct[n], 0.9)
        result[f"runner_{n}t_ms_p50"] = ms(runner[n])
        result[f"runner_{n}t_ms_p90"] = ms(runner[n], 0.9)
    return result


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    builds = [timed(build_reference_model) for _ in range(5)]
    with tempfile.TemporaryDirectory() as folder:
        first = timed(lambda: reference_model_path(folder))
        cached = timed(lambda: reference_model_path(folder))
        path = reference_model_path(folder)
        session = report.attempt(
            "a session",
            lambda: median(
                timed(lambda: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))
                for _ in range(5)
            ),
        )
        figures = report.attempt("the runs", asyncio.run, measure(path, args.rounds)) or {}
    result: dict[str, float | None] = {
        "macs": reference_model_macs(),
        "build_ms": 1e3 * statistics.median(builds),
        "path_first_ms": 1e3 * first,
        "path_cached_ms": 1e3 * cached,
        "session_ms": None if session is None else 1e3 * session,
        **figures,
    }
    print(f"reference model: {(result['macs'] or 0) / 1e9:.3f} G multiply-adds per run")
    for key in ("build_ms", "path_first_ms", "path_cached_ms", "session_ms"):
        print(f"  {key:<16} {cell(result[key], '8.2f')}")
    print(f"  {'threads':<16} {'direct p50':>10} {'p90':>7} {'runner p50':>11} {'p90':>7}")
    for n in THREADS:
        print(
            f"  {n:<16} {cell(result.get(f'direct_{n}t_ms_p50'), '10.2f')} "
            f"{cell(result.get(f'direct_{n}t_ms_p90'), '7.2f')} "
            f"{cell(result.get(f'runner_{n}t_ms_p50'), '11.2f')} "
            f"{cell(result.get(f'runner_{n}t_ms_p90'), '7.2f')}"
        )
    report.end({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()})


if __name__ == "__main__":
    run(main)

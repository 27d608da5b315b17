"""Benchmark: comparing two fleet runs (:func:`pipelines.dms.fleet.compare.compare_runs`).

Two synthetic run directories of ``--recordings`` recordings of ``--frames`` frames each (default
100 x 10,000: a million rows a side), in the frames' Parquet schema: random driver values for the
baseline; the candidate's moved on a few columns, by amounts that flip some of openpilot's
decisions, with a few frames missing on each side. Written once into a temporary folder (not
timed), then compared ``--rounds`` times.

Prints a table, then one JSON line: ``rows`` (a side), ``write_s``, ``compare_s`` (median of the
rounds), ``rows_per_s`` (rows of both sides a second), ``write_comparison_s``, ``peak_rss_mb``
(a step that fails is reported, see :mod:`benchmarks._report`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._report import Report, cell, median, ratio, rounded, run
from pipelines.dms.fleet.compare import compare_runs, write_comparison
from pipelines.dms.messages import READINESS_LAYERS
from pipelines.dms.sinks.parquet import DRIVER_COLUMNS, parquet_schema

T = TypeVar("T")

MOVED = {"left.faceProb": 0.05, "left.phoneProb": -0.04, "left.faceOrientation.1": 0.02}
"""The candidate's columns that move, and by how much (the baseline's value plus it)."""


def _recording(name: str, ids: np.ndarray, driver: dict[str, np.ndarray]) -> pa.Table:
    count = len(ids)
    sof = ids * 50_000_000
    columns: dict[str, object] = {
        "recording": pa.array([name] * count, pa.string()),
        "runId": pa.array(["bench"] * count, pa.string()),
        "seq": np.arange(count, dtype=np.int64),
        "frameId": ids,
        "valid": np.ones(count, dtype=bool),
        "eventValid": np.ones(count, dtype=bool),
        "availability": pa.array(["available"] * count, pa.string()),
        "reason": pa.array([""] * count, pa.string()),
        "reasonKind": pa.nulls(count, pa.string()),
        **{f"readiness.{layer}": np.ones(count, dtype=bool) for layer in READINESS_LAYERS},
        "timestampSof": sof,
        "timestampEof": sof + 1,
        "recordedTimestampSof": sof,
        "recordedTimestampEof": sof + 1,
        "frameAge": np.full(count, 0.03),
        "modelExecutionTime": np.full(count, 0.006),
        "gpuExecutionTime": np.zeros(count),
        **driver,
    }
    return pa.Table.from_pydict(columns, schema=parquet_schema())


def _write_runs(root: Path, recordings: int, frames: int, seed: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    runs = root / "baseline", root / "candidate"
    for index in range(recordings):
        name = f"drive-{index:05d}.dmsrec"
        driver = {column: rng.uniform(0, 1, frames).astype(np.float32) for column in DRIVER_COLUMNS}
        driver["wheelOnRightProb"] = rng.uniform(0, 0.3, frames).astype(np.float32)
        moved = dict(driver)
        for column, by in MOVED.items():
            moved[column] = (driver[column] + np.float32(by)).astype(np.float32)
        ids = np.arange(frames, dtype=np.int64)
        for side, values, kept in ((runs[0], driver, ids[1:]), (runs[1], moved, ids[:-2])):
            folder = side / "frames" / quote(name, safe="")
            folder.mkdir(parents=True)
            table = _recording(name, ids, values).take(pa.array(kept))
            pq.write_table(table, folder / "part-0.parquet", compression="zstd")
    return runs


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    return call(), time.perf_counter() - started


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", type=int, default=100)
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    comparison, times, write_s, written_s = None, [], None, None
    with tempfile.TemporaryDirectory(prefix="fleet-compare-") as folder:
        root = Path(folder)
        made = report.attempt(
            "the runs", timed, lambda: _write_runs(root, args.recordings, args.frames, seed=1)
        )
        if made is not None:
            (baseline, candidate), write_s = made
            for number in range(args.rounds):
                compared = report.attempt(
                    f"comparison {number + 1}", timed, lambda: compare_runs(baseline, candidate)
                )
                if compared is not None:
                    comparison, seconds = compared
                    times.append(seconds)
        if comparison is not None:
            kept = comparison
            wrote = report.attempt(
                "the comparison written",
                timed,
                lambda: write_comparison(kept, root / "comparison"),
            )
            written_s = None if wrote is None else wrote[1]
    compare_s = median(times)
    rows = None if comparison is None else comparison.rows_baseline
    both = None if comparison is None else comparison.rows_baseline + comparison.rows_candidate
    per_second = ratio(both, compare_s)
    result = {
        "rows": rows,
        "recordings": None if comparison is None else len(comparison.recordings),
        "compared": None if comparison is None else comparison.compared,
        "write_s": rounded(write_s),
        "compare_s": rounded(compare_s),
        "rows_per_s": None if per_second is None else round(per_second),
        "write_comparison_s": rounded(written_s),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(f"{'rows a side':<24} {cell(rows, '')}")
    print(f"{'compare (median)':<24} {cell(compare_s, '.3f')} s over {len(times)} rounds")
    print(f"{'rows/s (both sides)':<24} {cell(result['rows_per_s'], ',')}")
    print(f"{'write the comparison':<24} {cell(written_s, '.3f')} s")
    print(f"{'flip share':<24} {None if comparison is None else comparison.flip_shares}")
    report.end(result)


if __name__ == "__main__":
    run(main)

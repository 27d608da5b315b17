"""Benchmark: the DMS service as a guest on an application's event loop.

On one asyncio loop, as an application would have them: a neighbouring TCP echo server with a
client doing a round trip every millisecond, and a 1 ms lag probe (sleep 1 ms, record how late it
woke) — from a moment before ``async with DmsService(...)`` until a moment after it exits. Three
cases, each in a fresh interpreter (start-up costs paid once per process are in the figures, as
they are for an application): ``baseline`` (no service), ``sim`` (the simulated accelerator, as
``--device sim``) and ``cpu`` (onnxruntime on the CPU); the service on its embedded defaults,
the synthetic camera, ``--frames`` frames (default 300, 15 s at 20 Hz), no health endpoints and
no sink that writes anywhere, an application task reading its messages. No process-wide setting
is changed (garbage collector, switch interval, CPU placement).

Reported per case: loop lag p50/p99/max, echo round trip p50/p99, how many probe wake-ups were
more than 5 ms and 20 ms late (stalls), and each stall over 5 ms with when it happened (ms from
``async with``) and in which phase (starting, running, stopping). A case's interpreter must write
nothing but its result: what the service wrote to standard output or standard error is reported.
Final JSON line with ``baseline_lag_p99_ms``, ``sim_lag_p99_ms``, ``cpu_lag_p99_ms``, the
``*_lag_max_ms`` and ``*_echo_p99_ms`` of each case, ``*_stalls_over_5ms`` and
``*_stalls_over_20ms``, and ``targets_met``. Targets: loop lag p99 <= 2 ms; echo p99 <= the
baseline's + 1 ms; no stall over 20 ms. A case whose interpreter fails is reported with the last
line of its standard error, see :mod:`benchmarks._report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import collections
import json
import os
import time
from typing import Any

import numpy as np

from benchmarks._report import Report, cell, run
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.service import DmsService

CASES = ("baseline", "sim", "cpu")
ROOT = Path(__file__).resolve().parent.parent
LAG_P99_MS = 2.0
ECHO_OVER_BASELINE_MS = 1.0
STALL_MS = (5.0, 20.0)
MARGIN = 0.25
"""Seconds the probes run before the service starts and after it has stopped."""
ECHO_INTERVAL = 0.001
MESSAGE = b"x" * 64


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class Probes:
    """The neighbours on the loop: the lag probe and the echo client, until :meth:`stop`."""

    def __init__(self) -> None:
        self.lags: list[tuple[float, float]] = []
        """(when it woke, how late: seconds) per probe wake-up."""
        self.round_trips: list[float] = []
        self._stopping = False

    async def lag(self) -> None:
        while not self._stopping:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            woke = time.perf_counter()
            self.lags.append((woke, woke - asked - 0.001))

    async def echo(self, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not self._stopping:
                sent = time.perf_counter()
                writer.write(MESSAGE)
                await reader.readexactly(len(MESSAGE))
                self.round_trips.append(time.perf_counter() - sent)
                await asyncio.sleep(ECHO_INTERVAL)
        finally:
            writer.close()
            await writer.wait_closed()

    def stop(self) -> None:
        self._stopping = True


async def _echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def run_case(case: str, frames: int) -> dict[str, Any]:
    """One case on this process's loop: the probes' figures, the stalls, the service's frames."""
    server = await asyncio.start_server(_echo_handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probes = Probes()
    tasks = [asyncio.create_task(probes.lag()), asyncio.create_task(probes.echo(port))]
    await asyncio.sleep(MARGIN)
    phases: dict[str, float] = {}
    received = valid = 0
    phases["starting"] = time.perf_counter()
    if case == "baseline":
        phases["running"] = time.perf_counter()
        await asyncio.sleep(frames / 20)
        phases["stopping"] = time.perf_counter()
    else:
        config = ServiceConfig(device=case, frames=frames, health_port=None)
        async with DmsService(config) as service:
            phases["running"] = time.perf_counter()

            async def read_messages() -> None:
                nonlocal received, valid
                async for message in service.messages():
                    received += 1
                    valid += message.valid

            reader = asyncio.create_task(read_messages())
            await service.finished()
            reader.cancel()
            phases["stopping"] = time.perf_counter()
    phases["after"] = time.perf_counter()
    await asyncio.sleep(MARGIN)
    probes.stop()
    await asyncio.gather(*tasks)
    server.close()
    await server.wait_closed()
    start = phases["starting"]

    def phase(at: float) -> str:
        passed = [name for name, since in phases.items() if at >= since]
        return passed[-1] if passed else "before"

    lags = [late for _, late in probes.lags]
    stalls = [
        {
            "at_ms": round((woke - late - start) * 1e3, 1),
            "ms": round(late * 1e3, 1),
            "phase": phase(woke - late),
        }
        for woke, late in probes.lags
        if late * 1e3 > STALL_MS[0]
    ]
    return {
        "lag_p50_ms": _p(lags, 50) * 1e3,
        "lag_p99_ms": _p(lags, 99) * 1e3,
        "lag_max_ms": max(lags) * 1e3,
        "echo_p50_ms": _p(probes.round_trips, 50) * 1e3,
        "echo_p99_ms": _p(probes.round_trips, 99) * 1e3,
        "stalls_over_5ms": sum(late * 1e3 > STALL_MS[0] for late in lags),
        "stalls_over_20ms": sum(late * 1e3 > STALL_MS[1] for late in lags),
        "stalls": stalls,
        "probes": len(lags),
        "round_trips": len(probes.round_trips),
        "start_s": phases["running"] - start,
        "messages": received,
        "valid": valid,
    }


def measure(report: Report, case: str, frames: int) -> dict[str, Any] | None:
    """A case in an interpreter of its own (None where it failed: reported); what it wrote
    besides its result is reported."""
    command = [sys.executable, "-m", "benchmarks.embed", "--case", case, "--frames", str(frames)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = report.child(f"case {case}", command, timeout=600, cwd=ROOT, env=env)
    if done is None:
        return None
    lines = done.stdout.splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        report.fail(f"case {case}", "no result line")
        return None
    result["stdout_lines_besides_result"] = len(lines) - 1
    result["stderr_bytes"] = len(done.stderr)
    return result


FIGURES = ("lag_p50_ms", "lag_p99_ms", "lag_max_ms", "echo_p50_ms", "echo_p99_ms")


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300, help="frames per service case")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a child
    args = parser.parse_args()
    if args.frames < 20:
        parser.error("--frames must be at least 20")
    if args.case is not None:
        print(json.dumps(asyncio.run(run_case(args.case, args.frames))))
        return
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.frames} frames a "
        f"case; echo every {ECHO_INTERVAL * 1e3:g} ms, lag probe every 1 ms; each case in a "
        "fresh interpreter"
    )
    measured = {case: measure(report, case, args.frames) for case in CASES}
    rows = {case: r for case, r in measured.items() if r is not None}
    header = (
        f"{'case':<9} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} {'echo p50':>9} "
        f"{'echo p99':>9} {'>5 ms':>6} {'>20 ms':>6} {'start s':>8} {'valid':>11} {'out':>4}"
    )
    print(header)
    print("-" * len(header))
    for case in CASES:
        if case not in rows:
            print(f"{case:<9} {'-':>8} (failed: see above)")
            continue
        r = rows[case]
        frames = f"{r['valid']}/{r['messages']}" if case != "baseline" else "-"
        print(
            f"{case:<9} {cell(r['lag_p50_ms'], '>8.2f')} {cell(r['lag_p99_ms'], '>8.2f')} "
            f"{cell(r['lag_max_ms'], '>8.1f')} {cell(r['echo_p50_ms'], '>9.3f')} "
            f"{cell(r['echo_p99_ms'], '>9.3f')} {r['stalls_over_5ms']:>6} "
            f"{r['stalls_over_20ms']:>6} {r['start_s']:>8.2f} {frames:>11} "
            f"{r['stdout_lines_besides_result'] + r['stderr_bytes']:>4}"
        )
    print("(out: lines and bytes the case wrote to standard output and error besides its result)")
    print(
        "stalls over 5 ms: each one while a service starts or stops or over 20 ms; the rest counted"
    )
    for case, r in rows.items():
        listed = [s for s in r["stalls"] if s["phase"] in ("starting", "stopping") or s["ms"] > 20]
        for stall in listed:
            print(f"  {case}: {stall['ms']:.1f} ms at {stall['at_ms']:+.0f} ms ({stall['phase']})")
        others = collections.Counter(s["phase"] for s in r["stalls"] if s not in listed)
        if others:
            counted = ", ".join(f"{n} {phase}" for phase, n in others.items())
            print(f"  {case}: {counted} (5-20 ms)")
    baseline_echo = rows.get("baseline", {}).get("echo_p99_ms")

    def within(value: float | None, limit: float | None) -> bool:
        return value is not None and limit is not None and value <= limit

    missed = [
        f"{case}: {what}"
        for case in ("sim", "cpu")
        for what, ok in (
            (
                f"lag p99 <= {LAG_P99_MS} ms",
                within(rows.get(case, {}).get("lag_p99_ms"), LAG_P99_MS),
            ),
            (
                f"echo p99 <= baseline + {ECHO_OVER_BASELINE_MS} ms",
                within(
                    rows.get(case, {}).get("echo_p99_ms"),
                    None if baseline_echo is None else baseline_echo + ECHO_OVER_BASELINE_MS,
                ),
            ),
            ("no stall over 20 ms", rows.get(case, {}).get("stalls_over_20ms") == 0),
        )
        if not ok
    ]
    summary: dict[str, Any] = {}
    for case in CASES:
        r = rows.get(case, {})
        for key in FIGURES:
            value = r.get(key)
            summary[f"{case}_{key}"] = None if value is None else round(value, 3)
        summary[f"{case}_stalls_over_5ms"] = r.get("stalls_over_5ms")
        summary[f"{case}_stalls_over_20ms"] = r.get("stalls_over_20ms")
    print(f"targets missed: {', '.join(missed) if missed else 'none'}")
    report.end(summary, targets_met=not missed)


if __name__ == "__main__":
    run(main)

"""Benchmark: copying 8 MiB into and out of VRAM through the simulated bridge and GPU.

Side by side, in one run, round by round (machine noise hits every variant alike):

* ``memcpy``   — a plain copy of the same bytes in host memory: the ceiling;
* ``in-process`` — the copy protocol through the in-process simulator with zero device latency
  (the simulated GPU runs on the same event loop): what the host side costs;
* ``threaded`` — the same with the simulator on its own thread (transfers cross threads);
* ``libusb``   — the same through real libusb (python-libusb1, pollfds on the event loop) against
  the simulator served as an emulated USB device by umockdev.

In process, the simulated bridge and GPU do their share of the work (the bridge's copy into SRAM,
the copy engine's copy into VRAM) on the same thread as the host. A separate instrumented pass
measures that share, and the table shows the host side on its own too ("host side"): what the
runtime would cost with a real device doing its part.

The libusb variant needs umockdev's preload, which slows the whole process; it runs in a child
process under ``umockdev-wrapper`` (with its own memcpy baseline), after the others. Prints a table
(median MB/s, and the ratio to memcpy), then one JSON line with ``copyin_MBps``, ``copyout_MBps``,
``memcpy_MBps``, ``libusb_copyin_MBps``, ``libusb_copyout_MBps``, ``threaded_copyin_MBps``,
``threaded_copyout_MBps``, ``host_copyin_MBps``, ``host_copyout_MBps`` and ``targets_met``.
Target: copy-in and copy-out >= 1000 MB/s in process (a USB 3.2 Gen 2 link carries ~1200 MB/s).
A run that fails (the libusb child included) is reported, see :mod:`benchmarks._report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named after the protocol it measures; keep its folder off the import path so that
# it does not stand in for the standard library's ``copy`` module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import contextlib
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio

from benchmarks._report import Report, cell, median, ratio, rounded, run
from transports.gpu import GpuSession, SessionConfig
from transports.protocol.gpu import Sdma
from transports.sim.bridge import SimBridge
from transports.sim.engines import CopyEngine
from transports.sim.gpu import SimDevice
from transports.sim.server import SimServer
from transports.sim.umockdev import EmulatedBridge, umockdev_available
from transports.sim.urb import SimUrb
from transports.sim.usb import SimUsbTransport

ROOT = Path(__file__).resolve().parent.parent
SIZE = 8 << 20
TARGET = 1000.0


@contextlib.asynccontextmanager
async def in_process() -> AsyncIterator[GpuSession]:
    async with SimDevice(vram_size=64 << 20) as sim:
        gpu = await GpuSession.open(SimUsbTransport(sim.bridge))
        try:
            yield gpu
        finally:
            await gpu.aclose()


@contextlib.asynccontextmanager
async def threaded() -> AsyncIterator[GpuSession]:
    with SimServer(lambda: SimDevice(vram_size=64 << 20)) as server:
        gpu = await GpuSession.open(SimUsbTransport(server.device.bridge, call=server.call))
        try:
            yield gpu
        finally:
            await gpu.aclose()


@contextlib.asynccontextmanager
async def libusb() -> AsyncIterator[GpuSession]:
    from transports.usb.libusb_backend import open_bridge
    from transports.usb.libusb_loop import LibusbContext

    with (
        SimServer(lambda: SimDevice(vram_size=64 << 20)) as server,
        EmulatedBridge(server, server.device.bridge),
    ):
        async with LibusbContext() as context:
            usb = await open_bridge(context, timeout=10)
            gpu = await GpuSession.open(
                usb, config=SessionConfig(bulk_timeout=30, fence_timeout=30)
            )
            try:
                yield gpu
            finally:
                await gpu.aclose()


async def timed(step: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await step()
    return time.perf_counter() - start


@contextlib.contextmanager
def simulator_time() -> Iterator[list[float]]:
    """Count the seconds spent inside the simulator: bridge transfers and the copy engine's
    packets (a POLL counts only its checks, not the time it waits)."""
    spent = [0.0]
    submit, execute = SimBridge.submit, CopyEngine.execute

    def timed_submit(self: SimBridge, urb: SimUrb) -> None:
        start = time.perf_counter()
        submit(self, urb)
        spent[0] += time.perf_counter() - start

    async def timed_execute(self: CopyEngine, words: list[int]) -> None:
        if words[0] & 0xFF == Sdma.POLL:
            return await execute(self, words)
        start = time.perf_counter()
        await execute(self, words)
        spent[0] += time.perf_counter() - start

    SimBridge.submit, CopyEngine.execute = timed_submit, timed_execute  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        SimBridge.submit, CopyEngine.execute = submit, execute  # type: ignore[method-assign]


async def copies(variants: list[str], rounds: int) -> dict[str, list[float]]:
    data = os.urandom(SIZE)
    host = bytearray(SIZE)
    out = bytearray(SIZE)
    seconds: dict[str, list[float]] = {}

    def memcpy() -> None:
        host[:] = data

    makers = {"in-process": in_process, "threaded": threaded, "libusb": libusb}
    async with contextlib.AsyncExitStack() as stack:
        sessions = {v: await stack.enter_async_context(makers[v]()) for v in variants}
        buffers = {name: await gpu.alloc(SIZE) for name, gpu in sessions.items()}
        for name, gpu in sessions.items():  # warm up, and check the bytes arrive intact
            await gpu.copy_in(buffers[name], data)
            await gpu.copy_out(buffers[name], out=out)
            if out != data:
                raise RuntimeError(f"{name}: the copy did not round-trip")
        for _ in range(rounds):
            start = time.perf_counter()
            memcpy()
            seconds.setdefault("memcpy", []).append(time.perf_counter() - start)
            for name, gpu in sessions.items():
                buffer = buffers[name]
                seconds.setdefault(f"{name} copy-in", []).append(
                    await timed(lambda g=gpu, b=buffer: g.copy_in(b, data))
                )
                seconds.setdefault(f"{name} copy-out", []).append(
                    await timed(lambda g=gpu, b=buffer: g.copy_out(b, out=out))
                )
        if "in-process" in sessions:  # the host side alone: total minus the simulator's share
            gpu, buffer = sessions["in-process"], buffers["in-process"]
            steps = {
                "copy-in": lambda: gpu.copy_in(buffer, data),
                "copy-out": lambda: gpu.copy_out(buffer, out=out),
            }
            for _ in range(rounds):
                for what, step in steps.items():
                    with simulator_time() as spent:
                        total = await timed(step)
                    seconds.setdefault(f"host side {what}", []).append(total - spent[0])
    return seconds


def child_libusb(report: Report, rounds: int) -> dict[str, float] | None:
    """The libusb variant in a process of its own under umockdev-wrapper: its rates, or None
    (why not: said, or reported as a failure)."""
    wrapper = shutil.which("umockdev-wrapper")
    if wrapper is None:
        print("libusb: not measured: umockdev-wrapper is not installed (make setup installs it)")
        return None
    command = [wrapper, sys.executable, "-m", "benchmarks.copy", "--child-libusb", "--rounds",
               str(rounds)]  # fmt: skip
    return report.child_json("the libusb run", command, timeout=600, cwd=ROOT)


def rates(seconds: dict[str, list[float]]) -> dict[str, float]:
    """MB/s per variant: the median round's."""
    return {
        name: rate
        for name, values in seconds.items()
        if (rate := ratio(SIZE / 1e6, median(values))) is not None
    }


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--libusb-rounds", type=int, default=3)
    parser.add_argument("--child-libusb", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_libusb:
        if not umockdev_available():
            raise SystemExit("the libusb variant needs umockdev's preload (umockdev-wrapper)")
        print(json.dumps(rates(anyio.run(copies, ["libusb"], args.rounds))))
        return
    seconds = report.attempt(
        "the copies", anyio.run, copies, ["in-process", "threaded"], args.rounds
    )
    rate = rates(seconds or {})
    memcpy = rate.get("memcpy")
    libusb_rates = child_libusb(report, args.libusb_rounds) or {}
    print(
        f"copy of {SIZE >> 20} MiB, median of {args.rounds} rounds (libusb: {args.libusb_rounds})"
    )
    print(f"{'variant':<26} {'MB/s':>9} {'x memcpy':>9}")
    for name, value in rate.items():
        print(f"{name:<26} {value:>9.0f} {cell(ratio(value, memcpy), '>9.3f')}")
    for name, value in libusb_rates.items():
        label = "memcpy (under umockdev)" if name == "memcpy" else name
        print(
            f"{label:<26} {value:>9.0f} {cell(ratio(value, libusb_rates.get('memcpy')), '>9.3f')}"
        )

    def figure(table: dict[str, float], name: str) -> float | None:
        return rounded(table.get(name), 1)

    copy_in, copy_out = rate.get("in-process copy-in"), rate.get("in-process copy-out")
    summary = {
        "copyin_MBps": figure(rate, "in-process copy-in"),
        "copyout_MBps": figure(rate, "in-process copy-out"),
        "memcpy_MBps": rounded(memcpy, 1),
        "host_copyin_MBps": figure(rate, "host side copy-in"),
        "host_copyout_MBps": figure(rate, "host side copy-out"),
        "threaded_copyin_MBps": figure(rate, "threaded copy-in"),
        "threaded_copyout_MBps": figure(rate, "threaded copy-out"),
        "libusb_copyin_MBps": figure(libusb_rates, "libusb copy-in"),
        "libusb_copyout_MBps": figure(libusb_rates, "libusb copy-out"),
        "target_MBps": TARGET,
    }
    met = copy_in is not None and copy_out is not None and min(copy_in, copy_out) >= TARGET
    report.end(summary, targets_met=met)


if __name__ == "__main__":
    run(main)

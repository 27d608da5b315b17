"""Emulated USB: real libusb (python-libusb1 and pyusb) against the simulated bridge, served as a
umockdev device (:mod:`transports.sim.umockdev`).

These tests need the process to run under ``umockdev-wrapper``; run by hand without it, they skip.
``make test`` runs them as a step of their own, under the wrapper and with
``AIO_DMS_REQUIRE_UMOCKDEV=1``: then a missing emulation fails each test instead of skipping it, and
the run fails if any test was skipped at all. A bug in an emulated device hangs inside libusb's C
code, so every test here has a per-test timeout (pytest-timeout's thread method, which works there)
as well as an outer ``anyio.fail_after``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from fake_pcie import FakeGpu

from transports.sim import FaultPlan, SimBridge
from transports.sim.server import SimServer
from transports.sim.umockdev import EmulatedBridge, UmockdevUnavailable, require_umockdev

REQUIRED = os.environ.get("AIO_DMS_REQUIRE_UMOCKDEV") == "1"
"""Set by ``make test``: emulated USB must run here; a skip is a failure."""

_skipped: list[str] = []


@pytest.fixture(autouse=True)
def _emulated_usb() -> None:
    try:
        require_umockdev()
    except UmockdevUnavailable as exc:
        if REQUIRED:
            pytest.fail(f"AIO_DMS_REQUIRE_UMOCKDEV=1 but {exc}")
        pytest.skip(str(exc))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REQUIRED and _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REQUIRED and _skipped:
        terminalreporter.write_line(
            f"FAILED: {len(_skipped)} emulated-USB test(s) skipped under "
            f"AIO_DMS_REQUIRE_UMOCKDEV=1: {', '.join(_skipped)}",
            red=True,
        )


@contextlib.asynccontextmanager
async def _bridge() -> AsyncIterator[SimBridge]:
    yield SimBridge(FakeGpu(), plan=FaultPlan())  # on the simulation's loop: its clock


@pytest.fixture
def server() -> Iterator[SimServer[SimBridge]]:
    """A simulated bridge (a FakeGpu behind it) on its own thread."""
    with SimServer(_bridge) as running:
        yield running


@pytest.fixture
def emulated(server: SimServer[SimBridge]) -> Iterator[EmulatedBridge]:
    """That bridge as the USB device add1:0001, for libusb in this process."""
    with EmulatedBridge(server, server.device) as device:
        yield device

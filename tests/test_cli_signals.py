"""SIGINT and SIGTERM at chosen moments of a real ``aio-dms`` process: as its modules import, once
its work has ended, as its interpreter would finalise. Whatever the moment, the process ends with
the exit-code table's code and no traceback: the first signal stops the command (a run exits 0
with its summary, a replay 130), a second one exits 130 at once, the first one's echo (the same
signal within ``ECHO``) changes nothing, and a signal once the work has ended leaves the exit
code the work made.

The moments are chosen in the child itself (``tests/signal_moments/sitecustomize.py``, on its
``PYTHONPATH``), which signals itself there and says so on standard error: no test waits for
time to pass. Every child runs under an outer bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from test_dms_service_io import cabin_recording

from pipelines.exit_codes import ExitCode

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc"),
]

ROOT = Path(__file__).resolve().parent.parent
MOMENTS = Path(__file__).resolve().parent / "signal_moments"
BOUND = 120
"""Seconds a child may take, at most (an outer bound: each ends in a few seconds)."""
RUN = ["run", "--device", "cpu", "--calib", "0,0,0", "--health-port", "-1", "--duration", "60"]
"""A run that only a signal ends (within the bound)."""


def _aio_dms(*args: str, at: str = "", signals: str = "", **popen) -> subprocess.Popen[str]:
    """``aio-dms ARGS`` as its console script runs it (``pipelines.__main__``), signalling
    itself at the moment ``at`` (see ``signal_moments``)."""
    env = {**os.environ, "PYTHONPATH": str(MOMENTS), "AIO_DMS_SIGNAL_AT": at,
           "AIO_DMS_SIGNALS": signals}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen,
    )  # fmt: skip


def _ended(child: subprocess.Popen[str]) -> tuple[int, str, str]:
    with child:
        out, err = child.communicate(timeout=BOUND)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return child.returncode, out, err


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("signals") / "cabin.dmsrec"
    cabin_recording(path, list(range(6)), 0)
    return path


def test_the_console_script_is_the_process_entry_point():
    [script] = [e for e in entry_points(group="console_scripts") if e.name == "aio-dms"]
    assert script.value == "pipelines.__main__:main"


@pytest.mark.parametrize(
    ("module", "signum", "phase"),
    [
        ("argparse", "SIGINT", "the command line's modules importing"),
        ("argparse", "SIGTERM", "the command line's modules importing"),
        ("json", "SIGTERM", "the summary's modules importing"),
        ("numpy", "SIGINT", "the service's modules importing"),
        ("onnxruntime", "SIGTERM", "the service's modules importing"),
    ],
)
def test_a_signal_as_the_command_starts_stops_it_with_its_summary(module, signum, phase):
    code, out, err = _ended(_aio_dms(*RUN, at=f"import:{module}", signals=signum))
    assert f"sent {signum}" in err  # the moment came
    assert code == ExitCode.OK, (phase, err)  # a run stopped by a signal
    assert "summary (stopped: signal, before the service had started)" in out, (phase, out)


def test_a_signal_as_the_service_starts_its_health_server_stops_the_run():
    args = ["run", "--device", "cpu", "--calib", "0,0,0", "--health-port", "0", "--duration", "60"]
    code, out, err = _ended(_aio_dms(*args, at="import:hypercorn.asyncio", signals="SIGTERM"))
    assert "sent SIGTERM" in err and code == ExitCode.OK, err
    assert "summary (stopped: signal" in out


@pytest.mark.parametrize("module", ["argparse", "json"])
@pytest.mark.parametrize("signals", ["SIGINT,SIGTERM", "SIGTERM,SIGINT"])
def test_a_second_signal_as_the_command_starts_exits_130_at_once(module, signals):
    code, out, err = _ended(_aio_dms(*RUN, at=f"import:{module}", signals=signals))
    assert err.count("sent ") == 2 and code == ExitCode.INTERRUPTED, err
    assert "summary" not in out  # at once


@pytest.mark.parametrize(("module", "signum"), [("argparse", "SIGTERM"), ("json", "SIGINT")])
def test_the_first_signals_echo_changes_nothing(module, signum):
    code, out, err = _ended(_aio_dms(*RUN, at=f"import:{module}", signals=f"{signum},{signum}"))
    assert err.count(f"sent {signum}") == 2
    assert code == ExitCode.OK and "summary (stopped: signal, before" in out, err


def test_a_replay_stopped_as_it_starts_exits_130(recording):
    child = _aio_dms("replay", str(recording), "--device", "cpu", "--calib", "0,0,0",
                     "--health-port", "-1", at="import:argparse", signals="SIGTERM")  # fmt: skip
    code, _, err = _ended(child)
    assert "sent SIGTERM" in err and code == ExitCode.INTERRUPTED, err


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("at", ["exit", "teardown"])
def test_a_signal_once_the_work_has_ended_leaves_the_exit_code_it_made(at, signum, recording):
    """A replay that completed exits 0 whatever signal comes as the process ends: while it waits
    for its threads, or where the interpreter would finalise (the process leaves before)."""
    child = _aio_dms("replay", str(recording), "--device", "cpu", "--calib", "0,0,0",
                     "--health-port", "-1", "--no-budget", at=at, signals=signum)  # fmt: skip
    code, out, err = _ended(child)
    assert code == ExitCode.OK, err
    assert "summary" in out and "stopped: signal" not in out
    if at == "exit":
        assert f"sent {signum}" in err  # the moment came (a finalisation never does)


def test_a_second_signal_once_the_work_has_ended_exits_130(recording):
    child = _aio_dms("replay", str(recording), "--device", "cpu", "--calib", "0,0,0",
                     "--health-port", "-1", "--no-budget", at="exit",
                     signals="SIGINT,SIGTERM")  # fmt: skip
    code, _, err = _ended(child)
    assert err.count("sent ") == 2 and code == ExitCode.INTERRUPTED, err


def _handles(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (Linux: /proc's caught-signals mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(
        next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16
    )
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_and_its_echo_as_soon_as_the_handlers_are_in_stop_it_cleanly(signum):
    """The earliest moment a signal can be handled: as soon as the entry point's handlers are
    in (before them, the interpreter is still starting: see ``pipelines.__main__``). Sent there
    with its echo, several times over, to land in the start-up's phases: imports held, imports
    interrupted."""
    for _ in range(3):
        child = _aio_dms(*RUN)
        deadline = time.monotonic() + BOUND
        while not _handles(child.pid, signal.SIGTERM):  # Python catches SIGINT from its start
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.0005)  # a poll of the child's state, not a wait for it to happen
        child.send_signal(signum)
        child.send_signal(signum)
        code, out, err = _ended(child)
        assert code == ExitCode.OK and "summary (stopped: signal" in out, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_demo_runs_stops_it_with_exit_130(signum):
    child = _aio_dms("demo")
    assert child.stdout is not None
    assert child.stdout.readline().startswith("availability -> ")  # it runs (the timeout bounds)
    child.send_signal(signum)
    code, _, err = _ended(child)
    assert code == ExitCode.INTERRUPTED and "aio-dms demo: stopped by a signal" in err, err

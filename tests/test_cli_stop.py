"""Stopping ``aio-dms`` at any moment: a signal from the first line of its entry point on stops it
with the exit code of the table, a second one exits 130 at once, and never with a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_dms_service_io import cabin_recording

from pipelines import cli
from pipelines.cli import _jsonl_on_stdout, main, parse_args
from pipelines.cli.run import run
from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.source import clock_ns
from pipelines.exit_codes import ExitCode
from pipelines.stopping import ECHO, Interrupted, Stopping

ROOT = Path(__file__).resolve().parent.parent
CPU = ["--device", "cpu", "--calib", "0,0,0", "--health-port", "-1"]


def _handles(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (Linux: /proc's caught-signals mask). Python
    catches SIGINT from its start; SIGTERM only once the entry point has installed its own."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(
        next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16
    )
    return bool(caught >> (signum - 1) & 1)


def _spawn(*args: str, **popen) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_as_soon_as_the_entry_point_runs_stops_it_cleanly(signum):
    with _spawn("run", *CPU, "--duration", "60") as child:
        deadline = time.monotonic() + 60
        while not _handles(child.pid, signal.SIGTERM):  # the entry point's first line has run
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.001)
        child.send_signal(signum)
        out, err = child.communicate(timeout=30)  # bounded
    assert child.returncode == ExitCode.OK, err
    assert "Traceback" not in err and "summary (stopped: signal" in out, err  # early or late


def _interrupt(*args, **kwargs):
    raise Interrupted(signal.SIGINT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["parsing", "starting"])
@pytest.mark.parametrize("jsonl", [["--jsonl", "-"], []], ids=["jsonl-stdout", "no-jsonl"])
def test_a_signal_before_the_service_starts_prints_the_summary_clear_of_the_json_lines(
    where, jsonl, monkeypatch, capsys
):
    """As the parser is built (the service's modules importing) or as the service is built: the
    summary of a run that published nothing, on standard error when the JSON lines were to go
    to standard output."""
    if where == "parsing":
        monkeypatch.setattr(cli, "_parser", _interrupt)
    else:
        monkeypatch.setattr("pipelines.cli.run.DmsService", _interrupt)
    code = main(["run", *CPU, "--duration", "60", *jsonl])
    captured = capsys.readouterr()
    assert code == ExitCode.OK
    summary, elsewhere = (captured.err, captured.out) if jsonl else (captured.out, captured.err)
    assert "summary (stopped: signal, before the service had started)" in summary
    assert "frames received      0" in summary and "published valid      0" in summary
    assert "summary" not in elsewhere and "Traceback" not in captured.err
    if jsonl:
        assert captured.out == ""


def test_a_signal_before_a_replay_starts_exits_130_and_other_commands_say_so_on_stderr(
    monkeypatch, capsys
):
    monkeypatch.setattr(cli, "_parser", _interrupt)
    assert main(["replay", "in.dmsrec", "--jsonl=-"]) == ExitCode.INTERRUPTED
    captured = capsys.readouterr()
    assert captured.out == "" and "summary (stopped: signal, before" in captured.err
    assert main(["model-info"]) == ExitCode.INTERRUPTED
    captured = capsys.readouterr()
    assert (
        captured.out == "" and "aio-dms: stopped by a signal before it had started" in captured.err
    )


@pytest.mark.parametrize(
    "words",
    [
        ["--jsonl", "-"],
        ["--jsonl=-"],
        ["--js", "-"],
        ["--j=-"],
        ["--jsonl", "out.jsonl"],
        ["--jsonl", "-", "--jsonl", "out.jsonl"],
        ["--jsonl", "out.jsonl", "--jsonl", "-"],
        ["--camera", "-", "--zmq", "tcp://127.0.0.1:0"],
        [],
    ],
)
def test_the_json_lines_on_standard_output_are_read_from_the_words_as_the_parser_reads_them(words):
    parsed = parse_args(["run", *words])
    assert _jsonl_on_stdout(words) == (parsed.jsonl == "-")


class _Exited(Exception):
    pass


def test_the_first_signal_stops_the_command_and_a_second_exits_130_at_once(monkeypatch):
    codes: list[int] = []

    def exit_now(code: int) -> None:
        codes.append(code)
        raise _Exited

    clock = [100.0]
    monkeypatch.setattr(os, "_exit", exit_now)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    stopping = Stopping()
    with pytest.raises(Interrupted):  # before the loop runs: unwinds what the command is doing
        stopping._handle(signal.SIGTERM, None)
    stopping = Stopping()
    stopped: list[str] = []
    with stopping.calling(lambda: stopped.append("stop")):
        stopping._handle(signal.SIGINT, None)  # while the loop runs: the command's stop
        assert stopped == ["stop"] and not codes
        clock[0] += ECHO / 2
        stopping._handle(signal.SIGINT, None)  # the first one again (sent to the group too)
        assert stopped == ["stop"] and not codes and stopping.signals == 1
        clock[0] += ECHO
        with pytest.raises(_Exited):
            stopping._handle(signal.SIGINT, None)  # the second: at once, 130
    assert codes == [ExitCode.INTERRUPTED]


def test_another_signal_at_once_is_a_second_one(monkeypatch):
    """Only the first signal itself has an echo: SIGTERM right after SIGINT is a second."""
    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    monkeypatch.setattr(time, "monotonic", lambda: 5.0)
    stopping = Stopping()
    with stopping.calling(lambda: None):
        stopping._handle(signal.SIGINT, None)
        with pytest.raises(_Exited):
            stopping._handle(signal.SIGTERM, None)


def test_a_signal_held_is_acted_on_once_armed_and_one_after_the_work_changes_nothing(monkeypatch):
    """Held while what reports a stop imports (an import interrupted half-way is not safe to
    redo), raised once armed; once the command's work has ended (its calling block, or
    ``end()``), a first signal changes nothing — a second still exits 130."""
    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    clock = [10.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    stopping = Stopping()
    stopping.hold()
    stopping._handle(signal.SIGTERM, None)  # held: nothing raised here
    assert stopping.requested
    with pytest.raises(Interrupted):
        stopping.arm()
    stopping = Stopping()
    with stopping.calling(lambda: None):
        pass
    stopping._handle(signal.SIGINT, None)  # the work has ended
    assert not stopping.requested and stopping.signals == 1
    clock[0] += 2 * ECHO
    with pytest.raises(_Exited) as exited:
        stopping._handle(signal.SIGINT, None)
    assert exited.value.args == (ExitCode.INTERRUPTED,)
    stopping = Stopping()
    stopping.end()
    stopping._handle(signal.SIGTERM, None)
    assert not stopping.requested


def test_a_stop_raised_where_nothing_could_take_it_is_made_as_the_work_begins():
    """An ``Interrupted`` raised in a finaliser is dropped by the interpreter: the stop is still
    to be made, and the command's calling block makes it as it begins."""
    stopping = Stopping()
    with pytest.raises(Interrupted):
        stopping._handle(signal.SIGTERM, None)  # suppose it was dropped
    stopped: list[str] = []
    with stopping.calling(lambda: stopped.append("stop")):
        assert stopped == ["stop"]


def _frames(stop_after: int):
    """Frames stamped now; after ``stop_after`` of them, a SIGINT to this process."""
    y, uv = np.full((760, 1344), 90, np.uint8), np.full((380, 1344), 128, np.uint8)
    for k in range(10_000):
        if k == stop_after:
            signal.raise_signal(signal.SIGINT)
        sof = clock_ns()
        yield Frame.from_planes(y, uv, frame_id=k, timestamp_sof=sof, timestamp_eof=sof + 1)


async def _source(stop_after: int):
    for frame in _frames(stop_after):
        yield frame


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "code"), [("run", ExitCode.OK), ("replay", ExitCode.INTERRUPTED)]
)
def test_a_signal_mid_run_ends_it_with_its_summary_and_the_tables_exit_code(
    command, code, tmp_path, capsys
):
    path = tmp_path / "in.dmsrec"
    cabin_recording(path, [0], 0)
    argv = [command, *(["--camera", str(path)] if command == "run" else [str(path)]), *CPU]
    args = parse_args(argv)
    fixed = {"mode": "replay", "camera": str(path)} if command == "replay" else {}
    result = run(args, Stopping.install(), source=_source(stop_after=20), **fixed)
    captured = capsys.readouterr()
    assert result == code
    assert "summary (stopped: signal)" in captured.out
    assert "Traceback" not in captured.err


@pytest.mark.timeout(120)
def test_a_failing_file_sink_fails_the_run():
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with _spawn("run", *CPU, "--frames", "40", "--jsonl", "/dev/full") as child:
        _, err = child.communicate(timeout=100)
    assert child.returncode == ExitCode.FAILED, err
    assert "a sink failed" in err and "ENOSPC" in err and "Traceback" not in err


@pytest.mark.timeout(120)
def test_standard_output_closed_by_its_reader_ends_the_run_like_a_signal():
    with _spawn("run", *CPU, "--duration", "60", "--jsonl", "-") as child:
        assert child.stdout is not None and child.stderr is not None
        lines = [child.stdout.readline() for _ in range(3)]  # like `| head -3`
        child.stdout.close()
        try:
            err = child.stderr.read()
            child.wait(timeout=30)
        finally:
            child.kill()
    assert all(line.startswith('{"seq":') for line in lines)
    assert child.returncode == ExitCode.OK, err
    assert "standard output closed by its reader" in err and "Traceback" not in err

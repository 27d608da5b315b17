"""The progress line of replays and bounded runs: drawn on a terminal's standard error, redrawn at
most so often, finished with the last figures; never elsewhere."""

from __future__ import annotations

import io
import sys

import anyio
import pytest
from rich.console import Console
from test_dms_service_io import cabin_recording

from pipelines.cli import main
from pipelines.cli.progress import ProgressDisplay, follow_progress, progress_console
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.service import DmsService
from pipelines.exit_codes import ExitCode

CPU = ["--device", "cpu", "--calib", "0,0,0", "--health-port", "-1", "--budget", "2"]
REDRAW = "\r\x1b[2K"
"""How rich redraws the line: back to its start, the line erased."""


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def terminal() -> tuple[Console, io.StringIO]:
    screen = io.StringIO()
    return Console(file=screen, force_terminal=True, width=120), screen


def test_the_line_is_redrawn_at_most_every_tenth_of_a_second_and_finished_with_the_last_figures():
    console, screen = terminal()
    clock = [0.0]
    display = ProgressDisplay(console, "replay", clock=lambda: clock[0])
    for k in range(1, 11):
        clock[0] = k * 0.04
        display.update(
            frames=k, total_frames=10, valid=k - 1, published=k, availability="available"
        )
    display.close()
    text = screen.getvalue()
    drawn = [line for line in text.split(REDRAW) if "frames" in line]
    shown = [line.split(" frames")[0].split()[-1] for line in drawn]
    assert shown == ["1/10", "4/10", "7/10", "10/10", "10/10"]  # ... and once more as it closes
    assert "valid 90 %" in drawn[-1] and "available" in drawn[-1]
    assert text.endswith("\n\x1b[?25h")  # the line ended, the cursor shown again


def test_a_run_bounded_in_time_shows_its_seconds_and_one_of_unknown_length_its_count():
    console, screen = terminal()
    display = ProgressDisplay(console, "run")
    display.update(frames=30, seconds=1.54, total_seconds=10, valid=3, published=4)
    display.update(frames=31, seconds=1.6, total_seconds=10, force=True)
    display.close()
    assert "1.5/10 s, 30 frames" in screen.getvalue() and "valid 75 %" in screen.getvalue()
    console, screen = terminal()
    display = ProgressDisplay(console, "replay")
    display.update(frames=12, published=0)
    display.close()
    assert "12 frames" in screen.getvalue() and "valid -" in screen.getvalue()


@pytest.mark.parametrize(
    ("settings", "stderr", "stdout", "shown"),
    [
        ({"mode": "replay"}, Tty(), Tty(), True),
        ({"frames": 10}, Tty(), Tty(), True),
        ({"duration": 5.0}, Tty(), Tty(), True),
        ({}, Tty(), Tty(), False),  # a live run without an end: no progress to show
        ({"mode": "replay"}, io.StringIO(), Tty(), False),  # standard error no terminal
        ({"frames": 10, "jsonl": "-"}, Tty(), Tty(), False),  # the lines on the same screen
        ({"frames": 10, "jsonl": "-"}, Tty(), io.StringIO(), True),  # the lines in a pipe
    ],
)
def test_progress_is_shown_on_a_terminal_only_for_runs_with_an_end(settings, stderr, stdout, shown):
    console = progress_console(ServiceConfig(**settings), stderr, stdout)
    assert (console is not None) == shown
    if console is not None:
        assert console.file is stderr


@pytest.mark.anyio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_progress_of_a_service_follows_its_frames_to_the_end():
    console, screen = terminal()
    config = ServiceConfig(
        device="cpu", calib=(0.0, 0.0, 0.0), budget=2.0, health_port=None, mode="replay", frames=6
    )
    with anyio.fail_after(60):
        async with DmsService(config, source=SyntheticCamera(fps=200)) as service:
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow_progress, service, ProgressDisplay(console, "replay"))
                await service.finished()
                tg.cancel_scope.cancel()
    last = screen.getvalue().split(REDRAW)[-1]
    assert "6/6 frames" in last and "valid" in last


@pytest.mark.timeout(120)
def test_a_replay_on_a_terminal_draws_on_standard_error_and_nothing_on_standard_output(
    tmp_path, monkeypatch
):
    path = tmp_path / "in.dmsrec"
    cabin_recording(path, list(range(8)), 0)
    stderr, stdout = Tty(), Tty()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["replay", str(path), *CPU]) == ExitCode.OK
    assert "8/8 frames" in stderr.getvalue().split(REDRAW)[-1]
    assert "\x1b[" not in stdout.getvalue() and "frames received      8" in stdout.getvalue()


@pytest.mark.timeout(120)
def test_without_a_terminal_there_is_no_progress(tmp_path, capsys):
    path = tmp_path / "in.dmsrec"
    cabin_recording(path, list(range(8)), 0)
    assert main(["replay", str(path), *CPU]) == ExitCode.OK
    captured = capsys.readouterr()
    assert "\x1b[" not in captured.err + captured.out and "\r" not in captured.err
    assert "frames received      8" in captured.out

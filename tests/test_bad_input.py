"""Every option and every config value is checked before work starts: a bad one is one line on
standard error, exit code 2, no traceback (design C10).

The tables are keyed by the options and fields the declarations generate: an option or a field
without bad values of its own fails the test that walks them, so a new setting comes with its
bad inputs. The command line is driven in-process through ``main(argv)``; a handful of real
processes show that nothing else escapes either.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from openpilot_segments import build_segment
from report_runs import GPU_HANG, lines

from pipelines import cli
from pipelines.cli import build_parser, main
from pipelines.cli.fleet_compare import compare_command, compare_parser
from pipelines.dms.config.settings import ServiceConfig
from pipelines.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parent.parent


def arabic(digits: str) -> str:
    """``digits`` in Arabic-Indic digits, which Python's ``int()`` and ``float()`` read as
    numbers (``arabic("40")`` is U+0664 U+0660)."""
    return digits.translate(str.maketrans("0123456789", "".join(map(chr, range(0x660, 0x66A)))))


# Placeholders filled in per test: {missing} a path that does not exist, {dir} a directory,
# {garbage} a file that is no model, no video and no recording, {log} an earlier run's log;
# route segments that cannot be replayed (built when a test asks for one, see BAD_SEGMENT_DIRS).
BAD_OPTIONS: dict[str, list[list[str]]] = {
    "--camera": [[""], ["{missing}"], ["{dir}"], ["{segment_without_log}"],
                 ["{segment_without_camera_states}"], ["{segment_shorter_than_its_index}"],
                 ["{segment_not_hevc}"]],
    "--model": [["{missing}"], ["{dir}"], ["{garbage}"]],
    "--device": [["gpu"], [""], ["CPU"]],
    "--budget": [["0"], ["-1"], ["nan"], ["inf"], ["11"], ["abc"], ["1e999"],
                 [arabic("0.05")], ["0.0_5"], [" 0.05"], ["0x1p-4"]],
    "--stale-after": [["0"], ["-1"], ["nan"], ["inf"], ["11"], ["abc"], ["0.01"],  # < budget
                      [arabic("0.1")]],
    "--min-rate": [["0"], ["-1"], ["nan"], ["inf"], ["1001"], ["abc"], [arabic("16")]],
    "--realtime": [["0"], ["100"], ["-5"], ["x"], ["1.5"], [arabic("5")]],
    "--recover-after": [["0"], ["-1"], ["1.5"], ["abc"], [arabic("3")], ["1_0"]],
    "--unavailable-after": [["0"], ["-3"], ["2.5"], ["x"]],
    "--gpu-hang-after": [["0"], ["-0.1"], ["nan"], ["61"], ["x"]],
    "--backoff": [["5", "1"], ["0", "1"], ["nan", "1"], ["1", "inf"], ["-1", "2"], ["a", "b"],
                  ["1"], ["1e308", "1e308"], ["0.1", "301"], ["301", "400"]],
    "--calib": [["1,2"], ["a,b,c"], ["nan,0,0"], ["-0.1,0.05"], ["0,0,inf"], [""],
                [arabic("0") + ",0,0"], ["0,0,1_0"]],
    "--calib-stale-after": [["nan"], ["0"], ["-1"], ["inf"], ["x"]],
    "--camera-stall-after": [["nan"], ["0"], ["-1"], ["inf"], ["x"]],
    "--health-host": [["0.0.0.0"], ["example.com"], [""], ["999.1.1.1"], ["::"]],
    "--health-port": [["70000"], ["-5"], ["x"], ["1.5"], ["65536"], [arabic("9032")], ["9_032"]],
    "--zmq": [["garbage"], ["tcp://127.0.0.1:99999"], ["tcp://10.1.2.3:5000"],
              ["udp://127.0.0.1:5"], ["tcp://127.0.0.1"], ["tcp://:5"], [""]],
    "--jsonl": [["{missing}/out.jsonl"], ["{dir}"], [""], ["{garbage}"]],
    "--append": [["=yes"], []],
    "--rlog": [["{missing}/rlog"], ["{dir}"], [""], ["-"], ["{log}"], ["out.txt"], ["rlog.zstd"]],
    "--parquet": [["{missing}/out.parquet"], ["{dir}"], [""], ["-"], ["{garbage}"], ["{log}"]],
    "--csv": [["{missing}/out.csv"], ["{dir}"], [""], ["-"], ["{garbage}"]],
    "--cereal-zmq": [["10.1.2.3"], ["example.com"], ["="], ["=0.0.0.0"], ["tcp://127.0.0.1:5"]],
    "--run-id": [[""], ["a b"], ["-x"], ["x" * 65], ["id/1"]],
    "--summary-json": [["{missing}/summary.json"], ["{dir}"], [""]],
    "--compare": [[""], ["{dir}"], ["{missing}/compare.json"], ["compare.json"]],
    "--tolerance": [["-1"], ["nan"], ["inf"], ["x"], ["0.1"]],
    "--max-disagreement": [["1.5"], ["-0.1"], ["nan"], ["x"], ["0.5"]],
    "--allow-remote": [["=yes"]],
    "--raw-predictions": [["=1"]],
    "--no-budget": [["=on"]],
    "--frames": [["0"], ["-1"], ["x"], ["1.5"], [arabic("40")], ["1_000"], [" 40"]],
    "--duration": [["0"], ["-1"], ["nan"], ["inf"], ["x"]],
    "--faults": [["gpu-melt@3"], ["gpu-hang"], ["gpu-hang@x"], ["gpu-hang@3+0"], ["@3"],
                 [arabic("gpu-hang@40")], ["gpu-hang@4+" + arabic("2")], ["gpu-hang@1_0"]],
    "--threads": [["0"], ["-1"], ["257"], ["x"], [arabic("2")]],
    "--model-cpus": [["1;2"], ["99999"], ["-1"], [""], [arabic("1")], [" 1"]],
    "--model-load-timeout": [["0"], ["-1"], ["nan"], ["inf"]],
    "--device-open-timeout": [["0"], ["-1"], ["nan"], ["inf"]],
    "--fence-timeout": [["0"], ["-1"], ["nan"], ["inf"]],
    "--bulk-timeout": [["0"], ["-1"], ["nan"], ["inf"]],
    "--warp-plan-timeout": [["0"], ["-1"], ["nan"], ["inf"]],
    "--healthy-after": [["0"], ["-1"], ["nan"], ["inf"]],
    "--log-format": [["xml"], [""]],
    "--output": [["{garbage}"], ["{missing}/out.dmsrec"], ["{dir}"], [""]],
    "--out": [["{garbage}"], ["{dir}"], [""]],
    "--workers": [["0"], ["-1"], ["x"], ["1.5"], ["99999"]],
    "--address": [["nohost"], ["127.0.0.1:1"], ["ray://"], [""], ["127.0.0.1:x"]],
    "--baseline-model": [["{missing}"], ["{dir}"], ["{garbage}"]],
    "--frame-timeout": [["0"], ["-1"], ["nan"], ["inf"], ["x"]],
    "--start-timeout": [["0"], ["-1"], ["nan"], ["inf"], ["x"]],
    "--attempts": [["0"], ["-1"], ["x"], ["1.5"]],
}  # fmt: skip

COMMANDS = ("run", "replay", "record", "fleet")
"""The commands whose options the table covers."""

# Through the Python API: values of the wrong type or out of range, for every field.
BAD_FIELDS: dict[str, list[object]] = {
    "camera": ["", 5, None],
    "model": [5, b"x.onnx"],
    "device": ["gpu", 3, None],
    "budget": [0.0, -1.0, float("nan"), float("inf"), "x", True, None],
    "stale_after": [0.0, -1.0, float("nan"), float("inf"), "x", True, 0.01],
    "min_rate": [0.0, -1.0, float("nan"), float("inf"), 1001.0, "x", True],
    "realtime": [0, 100, -5, 1.5, "x", True],
    "recover_after": [0, -1, 1.5, True, "x"],
    "unavailable_after": [0, 2.5, False, None],
    "gpu_hang_after": [0.0, 61.0, float("nan"), None],
    "backoff_initial": [0.0, float("inf"), -1.0, None, 301.0, 1e308],
    "backoff_max": [0.0, float("nan"), None, 301.0, 1e308],
    "calib": [(0.0, 1.0), (float("nan"), 0.0, 0.0), "a,b,c", 5],
    "calib_stale_after": [0.0, float("nan"), -1.0, None],
    "camera_stall_after": [0.0, float("inf"), None],
    "health_host": ["0.0.0.0", "example.com", 5, None],
    "health_port": [70000, -5, 1.5, True, "x"],
    "zmq": ["garbage", "tcp://127.0.0.1:99999", "tcp://10.1.2.3:5", 5],
    "jsonl": ["", 5],
    "jsonl_append": ["yes", None, True],
    "rlog": ["", "-", "out.txt", Path("rlog.zstd"), Path("."), 5],
    "parquet": ["", "-", Path("."), Path("-"), 5, Path("out.parquet")],  # the last: not a replay
    "csv": ["", "-", Path("."), Path("-"), 5],
    "cereal_zmq": ["10.1.2.3", "::", "example.com", "", 5],
    "run_id": ["", "a b", 5],
    "mode": ["fast", None],
    "no_budget": ["yes", None],
    "allow_remote": ["yes", 1, None],
    "raw_predictions": ["yes", None],
    "frames": [0, -1, 1.5, True, "x"],
    "duration": [0.0, -1.0, float("nan"), float("inf"), "x"],
    "faults": [None, "gpu-melt@3", [1, 2], 5],
    "intra_op_threads": [0, 257, 1.5, None],
    "model_cpus": ["1;2", (), (-1,), 5],
    "model_load_timeout": [0.0, float("nan"), None],
    "device_open_timeout": [0.0, -1.0, None],
    "fence_timeout": [0.0, float("inf"), None],
    "bulk_timeout": [-1.0, None],
    "warp_plan_timeout": [0.0, None],
    "healthy_after": [0.0, float("nan"), None],
}


def _options(command: str) -> dict[str, argparse.Action]:
    chosen = next(c for c in cli.COMMANDS if c.name == command)
    commands = next(
        action
        for action in build_parser(chosen)._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser = commands.choices[command]
    return {
        flag: action
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }


def _argv(command: str, flag: str, values: list[str], paths: dict[str, str]) -> list[str]:
    values = [value.format_map(paths) for value in values]
    heads = {
        "replay": [command, "in.dmsrec"],
        "record": [command, "--frames", "3", "-o", "new"],
        "fleet": [command, "in.dmsrec", "--out", "new-run"],
    }
    head = heads.get(command, [command])  # what the command needs, then the value to refuse
    if values and values[0].startswith("="):
        return [*head, flag + values[0], *values[1:]]
    return [*head, flag, *values]


def _not_hevc(path: Path) -> None:
    build_segment(path)
    (path / "dcamera.hevc").write_bytes(b"not a video" * 100)


BAD_SEGMENT_DIRS = {
    "segment_without_log": lambda path: build_segment(path, log=None),
    "segment_without_camera_states": lambda path: build_segment(path, camera_states=False),
    "segment_shorter_than_its_index": lambda path: build_segment(path, video_frames=2),
    "segment_not_hevc": _not_hevc,
}
"""Route segment directories that cannot be replayed, by placeholder: how each is made."""


class _Paths(dict[str, str]):
    """The placeholders' paths; a route segment's is built when a value first names it."""

    def __init__(self, root: Path, paths: dict[str, str]) -> None:
        super().__init__(paths)
        self.root = root

    def __missing__(self, key: str) -> str:
        path = self.root / f"{key}--0"
        BAD_SEGMENT_DIRS[key](path)
        self[key] = str(path)
        return self[key]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"no model, no video, no recording")
    (tmp_path / "in.dmsrec").write_bytes(b"")
    (tmp_path / "rlog").write_bytes(b"")
    found = {
        "missing": str(tmp_path / "missing"),
        "dir": str(tmp_path),
        "garbage": str(garbage),
        "log": str(tmp_path / "rlog"),
    }
    return _Paths(tmp_path, found)


def _cases() -> list[tuple[str, str, list[str]]]:
    return [
        (command, flag, values)
        for command in COMMANDS
        for flag in _options(command)
        for values in BAD_OPTIONS.get(flag, [])
    ]


def test_every_option_of_every_command_has_bad_values_in_the_table():
    for command in COMMANDS:
        missing = sorted(set(_options(command)) - set(BAD_OPTIONS))
        assert not missing, f"{command}: options without bad values: {missing}"
        assert all(BAD_OPTIONS[flag] for flag in _options(command))


def test_every_config_field_has_bad_values_in_the_table():
    fields = {item.name for item in dataclasses.fields(ServiceConfig)}
    assert fields == set(BAD_FIELDS), sorted(fields ^ set(BAD_FIELDS))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("command", "flag", "values"), _cases(), ids=lambda v: str(v))
def test_a_bad_option_is_one_line_and_exit_code_2(
    command, flag, values, paths, capsys, monkeypatch
):
    monkeypatch.chdir(paths["dir"])
    argv = _argv(command, flag, values, paths)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit
        code = exc.code
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == ExitCode.REFUSED, (argv, captured.err)
    assert len(lines) == 1 and lines[0].startswith("aio-dms"), (argv, captured.err)
    assert "Traceback" not in captured.err and not captured.out


LONG = "x" * 100_000
"""A value of 100 kB: refused by every option, and echoed cut short."""


def _long_cases() -> list[tuple[str, str, list[str]]]:
    cases = []
    for command in COMMANDS:
        for flag, action in _options(command).items():
            if action.nargs == 0:
                continue  # a switch: no value
            count = action.nargs if isinstance(action.nargs, int) else 1
            cases.append((command, flag, [f"={LONG}"] if action.nargs == "?" else [LONG] * count))
    return cases


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("command", "flag", "values"), _long_cases(), ids=lambda v: "LONG" if isinstance(v, list) else v
)
def test_a_value_of_100_kb_is_echoed_cut_short_in_its_one_line(
    command, flag, values, paths, capsys, monkeypatch
):
    monkeypatch.chdir(paths["dir"])
    try:
        code = main(_argv(command, flag, values, paths))
    except SystemExit as exc:  # argparse's own refusals exit
        code = exc.code
    lines = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED and len(lines) == 1, lines
    assert len(lines[0]) < 400, lines[0][:400]  # the value cut short, if echoed at all


@pytest.mark.timeout(60)
@pytest.mark.parametrize("segment", sorted(BAD_SEGMENT_DIRS))
def test_a_route_segment_to_replay_that_cannot_be_is_one_line_and_exit_code_2(
    segment, paths, capsys
):
    code = main(["replay", paths[segment], "--health-port", "-1"])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == ExitCode.REFUSED, captured.err
    assert len(lines) == 1 and lines[0].startswith("aio-dms replay: route segment "), lines
    assert "Traceback" not in captured.err and not captured.out


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in BAD_FIELDS.items() for value in values],
    ids=lambda v: repr(v)[:40],
)
def test_a_bad_config_value_is_a_value_error_saying_what_was_expected(name, value):
    with pytest.raises(ValueError) as refused:
        ServiceConfig(**{name: value})
    message = str(refused.value)
    assert "\n" not in message and name in message, message


@pytest.mark.timeout(60)
def test_a_health_port_in_use_is_one_line_naming_the_port_and_its_option(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["run", "--device", "cpu", "--health-port", str(port), "--frames", "3"])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(err) == 1 and f"port {port}" in err[0] and "[--health-port]" in err[0], err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--model", "{garbage}", "--health-port", "-1"],
        ["run", "--zmq", "tcp://10.0.0.1:5000"],
        ["run", "--cereal-zmq", "10.0.0.1"],
        ["run", "--calib", "-0.1,0.05", "--threads", "0"],
        ["replay", "{missing}"],
        ["run", "--duration", "nan"],
        ["replay", "{segment_without_camera_states}"],
    ],
    ids=[
        "broken-model",
        "remote-zmq",
        "remote-cereal",
        "negative-calib",
        "replay-missing",
        "nan-duration",
        "replay-bad-segment",
    ],
)
def test_no_traceback_escapes_a_real_process(argv, paths):
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *(arg.format_map(paths) for arg in argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=100,
    )
    assert result.returncode == ExitCode.REFUSED, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


# aio-dms report's options (its input's bad forms: tests/test_report_command.py). {run} is the
# JSON lines of a run, {garbage} a file that exists.
BAD_REPORT_OPTIONS: dict[str, list[list[str]]] = {
    "--output": [["{garbage}"], ["{garbage}/sub"]],
    "--budget": [["0"], ["-1"], ["nan"], ["inf"], ["11"], ["abc"], ["1e999"]],
    "--run": [["0"], ["2"], ["-1"], ["x"], ["1.5"], [arabic("1")]],
}  # fmt: skip


def test_every_option_of_report_has_bad_values_in_the_table():
    missing = sorted(set(_options("report")) - set(BAD_REPORT_OPTIONS))
    assert not missing, f"report: options without bad values: {missing}"


@pytest.mark.parametrize(
    ("flag", "values"),
    [(flag, values) for flag, table in BAD_REPORT_OPTIONS.items() for values in table],
    ids=lambda v: str(v),
)
def test_a_bad_report_option_is_one_line_and_exit_code_2(flag, values, paths, capsys, tmp_path):
    run = tmp_path / "run.jsonl"
    run.write_text("\n".join(lines(GPU_HANG)) + "\n")
    given = [value.format(**paths) for value in values]
    argv = ["report", str(run), "-o", str(tmp_path / "out"), flag, *given]
    code = main(argv)
    captured = capsys.readouterr()
    lines_out = captured.err.splitlines()
    assert code == ExitCode.REFUSED, (argv, captured.err)
    assert len(lines_out) == 1 and lines_out[0].startswith("aio-dms"), (argv, captured.err)
    assert "Traceback" not in captured.err and not captured.out
    assert not (tmp_path / "out").exists()


# aio-dms fleet compare's options (its inputs' bad forms: tests/test_fleet_compare.py). {garbage}
# is a file that exists, {frames} the frames folder of the candidate run.
BAD_FLEET_COMPARE_OPTIONS: dict[str, list[list[str]]] = {
    "--out": [[""], ["{garbage}"], ["{garbage}/sub"], ["{frames}"], ["{frames}/r"]],
}


def test_every_option_of_fleet_compare_has_bad_values_in_the_table():
    parser = compare_parser()
    flags = {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    missing = sorted(flags - set(BAD_FLEET_COMPARE_OPTIONS))
    assert not missing, f"fleet compare: options without bad values: {missing}"


@pytest.mark.parametrize(
    ("flag", "values"),
    [(flag, values) for flag, table in BAD_FLEET_COMPARE_OPTIONS.items() for values in table],
    ids=lambda v: str(v),
)
def test_a_bad_fleet_compare_option_is_one_line_and_exit_code_2(
    flag, values, paths, capsys, tmp_path
):
    from fleet_runs import frames, write_run  # pyarrow: for this test only

    a = write_run(tmp_path / "a", [frames("r", range(2))])
    b = write_run(tmp_path / "b", [frames("r", range(2))])
    given = [value.format(**paths, frames=b / "frames") for value in values]
    code = compare_command([str(a), str(b), flag, *given])
    captured = capsys.readouterr()
    lines_out = captured.err.splitlines()
    assert code == ExitCode.REFUSED, (values, captured.err)
    assert len(lines_out) == 1 and lines_out[0].startswith("aio-dms fleet compare: "), lines_out
    assert "Traceback" not in captured.err and not captured.out
    assert not (b / "comparison").exists()

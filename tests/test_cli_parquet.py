"""``aio-dms replay INPUT --parquet OUT``: one row per frame with its JSON line's values, and OUT
written only by a replay that ended by itself, every row written."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import anyio
import numpy as np
import pyarrow.parquet as pq
import pytest
from test_cli_stop import _source
from test_dms_service_io import cabin_recording

from pipelines.cli import main, parse_args
from pipelines.cli.run import run
from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.source import clock_ns
from pipelines.dms.sinks.parquet import (
    DRIVER_COLUMNS,
    PARQUET_COLUMNS,
    parquet_schema,
    partial_path,
)
from pipelines.exit_codes import ExitCode
from pipelines.stopping import Stopping

pytestmark = pytest.mark.timeout(120)

CPU = ["--device", "cpu", "--calib", "0,0,0", "--health-port", "-1", "--budget", "2"]
"""The model on the CPU, a static calibration, no health port, a budget no busy machine misses."""


def _columns(line: dict) -> dict[str, object]:
    """A JSON line's values under the Parquet columns' names."""
    record = dict(line)
    for layer, up in line["readiness"].items():
        record[f"readiness.{layer}"] = up
    if line["leftDriverData"] is None:  # no driver data: every driver column is null
        record.update(dict.fromkeys(DRIVER_COLUMNS))
        return record
    for short, side in (("left", "leftDriverData"), ("right", "rightDriverData")):
        for name, value in line[side].items():
            if isinstance(value, list):
                record.update({f"{short}.{name}.{i}": v for i, v in enumerate(value)})
            else:
                record[f"{short}.{name}"] = value
    return record


def test_a_replay_writes_one_row_per_frame_with_the_values_of_its_json_lines(tmp_path, capsys):
    recording, out = tmp_path / "drive-7.dmsrec", tmp_path / "drive-7.parquet"
    lines_path, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    recorded = cabin_recording(recording, list(range(30)), 1_700_000_000 * 10**9)
    argv = ["replay", str(recording), *CPU, "--parquet", str(out), "--jsonl", str(lines_path),
            "--faults", "nan-output@10+3", "--summary-json", str(summary)]  # fmt: skip
    assert main(argv) == ExitCode.OK, capsys.readouterr().err
    lines = [json.loads(line) for line in lines_path.read_text().splitlines()]
    lines = [line for line in lines if line["frameId"] >= 0]  # frames' messages: the rows
    table = pq.read_table(out)
    assert table.schema == parquet_schema()
    rows = table.to_pylist()
    assert len(rows) == len(lines) == 30
    nulls = 0
    for row, line in zip(rows, lines, strict=True):
        expected = _columns(line)
        for column in PARQUET_COLUMNS:
            if column == "recording":
                assert row[column] == "drive-7.dmsrec"
            elif column == "eventValid":
                with_data = line["leftDriverData"] is not None
                assert row[column] == (with_data and line["availability"] != "unavailable")
            else:
                assert row[column] == expected[column], (line["seq"], column)
        assert row["recordedTimestampSof"] == recorded[row["frameId"]]
        nulls += row["left.faceProb"] is None
    assert nulls == 3  # the invalid outputs carry no driver data
    sinks = {sink["name"]: sink for sink in json.loads(summary.read_text())["sinks"]}
    counted = sinks[f"parquet {out}"]
    assert (counted["published"], counted["delivered"], counted["dropped"]) == (30, 30, 0)
    assert not partial_path(out).exists()
    assert f"sink parquet {out}" in capsys.readouterr().out


def test_an_interrupted_replay_leaves_no_file_and_says_where_its_rows_are(tmp_path, capsys):
    recording, out = tmp_path / "in.dmsrec", tmp_path / "out.parquet"
    cabin_recording(recording, [0], 0)
    args = parse_args(["replay", str(recording), *CPU, "--parquet", str(out)])
    stopping = Stopping.install()
    code = run(args, stopping, source=_source(stop_after=20), mode="replay", camera=str(recording))
    err = capsys.readouterr().err
    assert code == ExitCode.INTERRUPTED
    assert not out.exists()
    rows = pq.read_table(partial_path(out)).column("frameId").to_pylist()
    assert rows == list(range(len(rows))) and 0 < len(rows) <= 20  # what was published, readable
    assert "parquet file not completed" in err and str(partial_path(out)) in err


async def _failing_source(frames: int):
    """``frames`` frames, then the disk under the input fails."""
    y, uv = np.full((760, 1344), 90, np.uint8), np.full((380, 1344), 128, np.uint8)
    for k in range(frames):
        sof = clock_ns()
        yield Frame.from_planes(y, uv, frame_id=k, timestamp_sof=sof, timestamp_eof=sof + 1)
    raise OSError(errno.EIO, "Input/output error")


def test_a_replay_whose_input_fails_fails_and_leaves_no_file(tmp_path, capsys):
    recording, out = tmp_path / "in.dmsrec", tmp_path / "out.parquet"
    cabin_recording(recording, [0], 0)
    args = parse_args(["replay", str(recording), *CPU, "--parquet", str(out)])
    code = run(args, Stopping.install(), source=_failing_source(6), mode="replay",
               camera=str(recording))  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED and "the camera failed: OSError" in err
    assert not out.exists()
    assert pq.read_table(partial_path(out)).num_rows == 6


async def _taking_the_path(path: Path):
    """Frames; midway, a file appears at ``path``."""
    y, uv = np.full((760, 1344), 90, np.uint8), np.full((380, 1344), 128, np.uint8)
    for k in range(8):
        if k == 4:
            await anyio.Path(path).write_bytes(b"another's")
        sof = clock_ns()
        yield Frame.from_planes(y, uv, frame_id=k, timestamp_sof=sof, timestamp_eof=sof + 1)


def test_a_file_put_at_the_output_meanwhile_is_kept_and_the_replay_fails(tmp_path, capsys):
    recording, out = tmp_path / "in.dmsrec", tmp_path / "out.parquet"
    cabin_recording(recording, [0], 0)
    args = parse_args(["replay", str(recording), *CPU, "--parquet", str(out)])
    code = run(args, Stopping.install(), source=_taking_the_path(out), mode="replay",
               camera=str(recording))  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED
    assert f"a sink failed: parquet {out}: could not be completed" in err
    assert out.read_bytes() == b"another's"
    assert pq.read_table(partial_path(out)).num_rows == 8


def test_an_output_that_exists_is_refused_before_any_work(tmp_path, capsys):
    recording, out, lines = tmp_path / "in.dmsrec", tmp_path / "out.parquet", tmp_path / "o.jsonl"
    cabin_recording(recording, [0, 1], 0)
    out.write_bytes(b"an earlier replay's")
    argv = ["replay", str(recording), *CPU, "--parquet", str(out), "--jsonl", str(lines)]
    assert main(argv) == ExitCode.REFUSED
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and "exists" in err[0] and str(out) in err[0], err
    assert out.read_bytes() == b"an earlier replay's" and not lines.exists()
    assert not partial_path(out).exists() and not captured.out


def test_parquet_is_an_option_of_replay_only(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["run", *CPU, "--frames", "3", "--parquet", str(tmp_path / "out.parquet")])
    assert refused.value.code == ExitCode.REFUSED
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "unrecognized arguments: --parquet" in err[0], err


def test_without_pyarrow_the_replay_is_refused_naming_the_extra(tmp_path, capsys, monkeypatch):
    recording, out = tmp_path / "in.dmsrec", tmp_path / "out.parquet"
    cabin_recording(recording, [0, 1], 0)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert main(["replay", str(recording), *CPU, "--parquet", str(out)]) == ExitCode.REFUSED
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "pip install 'aio-dms[fleet]'" in err[0], err
    assert err[0].endswith("[--parquet]") and not out.exists()


def test_the_summary_document_is_refused_the_parquet_file(tmp_path, capsys):
    recording, out = tmp_path / "in.dmsrec", tmp_path / "out.parquet"
    cabin_recording(recording, [0], 0)
    argv = ["replay", str(recording), *CPU, "--parquet", str(out), "--summary-json", str(out)]
    assert main(argv) == ExitCode.REFUSED
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is the --parquet file" in err[0], err

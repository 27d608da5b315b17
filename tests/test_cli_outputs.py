"""What ``aio-dms run`` and ``replay`` leave behind: JSON lines that are only JSON lines, a JSON lines
file never appended to by accident, and the summary as one JSON document however the run ends."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from test_cli_stop import _source
from test_dms_service_io import cabin_recording

from pipelines import cli
from pipelines.cli import main, parse_args
from pipelines.cli.run import run
from pipelines.dms.summary import SUMMARY_VERSION, RunSummaryRecord
from pipelines.exit_codes import ExitCode
from pipelines.stopping import Stopping

ROOT = Path(__file__).resolve().parent.parent
CPU = ["--device", "cpu", "--calib", "0,0,0", "--health-port", "-1", "--budget", "2"]
"""The model on the CPU, a static calibration, no health port, a budget no busy machine misses."""


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def schema_keys(kind: type) -> set[str]:
    return set(typing.get_type_hints(kind))


def check_schema(document: dict) -> None:
    """The document has exactly the fields its schema declares, nested ones too."""
    assert set(document) == schema_keys(RunSummaryRecord)
    hints = typing.get_type_hints(RunSummaryRecord)
    for name in ("frames", "frameAgeMs"):
        assert set(document[name]) == schema_keys(hints[name])
    assert document["version"] == SUMMARY_VERSION
    assert set(document["availabilitySeconds"]) == {"available", "degraded", "unavailable"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["run", "replay"])
def test_json_lines_on_standard_output_are_all_that_is_there_the_summary_on_standard_error(
    command, tmp_path
):
    if command == "replay":
        cabin_recording(tmp_path / "in.dmsrec", list(range(20)), 0)
    words = ["replay", str(tmp_path / "in.dmsrec")] if command == "replay" else ["run"]
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *words, *CPU, "--frames", "20", "--jsonl", "-",
         "--faults", "nan-output@5+2"],
        capture_output=True, text=True, cwd=ROOT, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # every line is JSON
    assert lines and result.stdout.endswith("\n")
    assert [line["seq"] for line in lines] == list(range(len(lines)))
    assert len({line["runId"] for line in lines}) == 1
    assert "frames received      20" in result.stderr and "summary" not in result.stdout
    valid = int(re.search(r"published valid\s+(\d+)", result.stderr).group(1))
    assert valid == sum(line["valid"] for line in lines)  # the summary, of these lines


@pytest.mark.timeout(120)
def test_a_json_lines_file_that_exists_is_refused_before_any_work_unless_appended_to(
    tmp_path, capsys
):
    out = tmp_path / "out.jsonl"
    out.write_text('{"seq": 0, "runId": "earlier"}\n')
    code = main(["run", *CPU, "--frames", "10", "--jsonl", str(out)])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(err) == 1 and "exists" in err[0] and "--append" in err[0], err
    assert out.read_text() == '{"seq": 0, "runId": "earlier"}\n'
    assert main(["run", *CPU, "--frames", "10", "--jsonl", str(out), "--append"]) == ExitCode.OK
    earlier, *appended = read_lines(out)
    assert earlier == {"seq": 0, "runId": "earlier"}
    assert appended and len({line["runId"] for line in appended} - {"earlier"}) == 1
    assert [line["seq"] for line in appended] == list(range(len(appended)))  # apart by runId


@pytest.mark.timeout(120)
def test_the_summary_document_says_what_the_run_did(tmp_path, capsys):
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    argv = ["run", *CPU, "--frames", "30", "--faults", "nan-output@10+3", "--jsonl", str(out),
            "--summary-json", str(summary), "--run-id", "bench-1"]  # fmt: skip
    assert main(argv) == ExitCode.OK
    text = capsys.readouterr().out
    document = json.loads(summary.read_text())
    check_schema(document)
    lines = read_lines(out)
    assert document["runId"] == "bench-1" == lines[0]["runId"]
    assert (document["command"], document["input"], document["device"], document["model"]) == (
        "run",
        "synthetic",
        "cpu",
        "reference",
    )
    assert (document["exitCode"], document["stopped"], document["error"]) == (0, None, None)
    frames = document["frames"]
    assert frames["received"] == 30 == frames["published"] + frames["dropped"]
    assert frames["valid"] == sum(line["valid"] for line in lines)
    assert frames["published"] == len(lines) == frames["valid"] + frames["invalid"]
    nan = {10, 11, 12} & {
        line["frameId"] for line in lines
    }  # those published (a loaded host drops)
    assert nan and document["invalidByKind"]["invalid output"] == len(nan)
    assert sum(document["invalidByKind"].values()) == frames["invalid"]
    ages = document["frameAgeMs"]
    assert 0 < ages["p50"] <= ages["p90"] <= ages["p99"] <= ages["max"]
    transitions = document["transitions"]
    assert transitions[0] == {"atS": 0.0, "state": "unavailable", "reason": "starting"}
    assert [t["atS"] for t in transitions] == sorted(t["atS"] for t in transitions)
    assert any(t["reason"] and t["reason"].startswith("invalid output") for t in transitions)
    seconds = document["availabilitySeconds"]
    assert seconds["available"] > 0 and sum(seconds.values()) >= transitions[-1]["atS"]
    (jsonl,) = [sink for sink in document["sinks"] if sink["name"] == f"jsonl {out}"]
    assert (jsonl["published"], jsonl["delivered"], jsonl["dropped"]) == (len(lines), len(lines), 0)
    assert document["startedAt"] < document["endedAt"] and document["endedAt"].endswith("Z")
    assert f"frames received      {frames['received']}" in text  # the same figures as the text
    assert f"{document['invalidByKind']['invalid output']:5d}  invalid output" in text


@pytest.mark.timeout(120)
def test_the_summary_document_of_a_failed_run_says_why(tmp_path, capsys):
    broken, summary = tmp_path / "broken.dmsrec", tmp_path / "summary.json"
    broken.write_bytes(b"DMSNV12\x00\x01")  # a recording cut short in its header
    argv = ["run", *CPU, "--camera", str(broken), "--summary-json", str(summary)]
    assert main(argv) == ExitCode.FAILED
    document = json.loads(summary.read_text())
    check_schema(document)
    assert document["exitCode"] == 1 and document["input"] == str(broken)
    assert document["error"].startswith("the camera failed: ReplayFormatError")
    assert document["frames"]["received"] == 0 and document["frameAgeMs"]["p50"] is None
    assert "the camera failed" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "code"), [("run", ExitCode.OK), ("replay", ExitCode.INTERRUPTED)]
)
def test_the_summary_document_of_a_run_stopped_by_a_signal_has_what_it_did(
    command, code, tmp_path, capsys
):
    path, summary = tmp_path / "in.dmsrec", tmp_path / "summary.json"
    cabin_recording(path, [0], 0)
    source = ["--camera", str(path)] if command == "run" else [str(path)]
    args = parse_args([command, *source, *CPU, "--summary-json", str(summary)])
    fixed = {"mode": "replay", "camera": str(path)} if command == "replay" else {}
    assert run(args, Stopping.install(), source=_source(stop_after=20), **fixed) == code
    document = json.loads(summary.read_text())
    check_schema(document)
    assert (document["command"], document["exitCode"], document["stopped"]) == (
        command,
        code,
        "signal",
    )
    assert document["frames"]["received"] >= 20  # the signal came with the 20th frame
    assert "summary (stopped: signal)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "code"), [("run", ExitCode.OK), ("replay", ExitCode.INTERRUPTED)]
)
def test_the_summary_document_of_a_command_stopped_before_it_started_says_so(
    command, code, tmp_path, capsys
):
    summary = tmp_path / "summary.json"
    words = [command, *(["in.dmsrec"] if command == "replay" else []), "--run-id", "r-1",
             "--summ", str(summary)]  # fmt: skip
    assert cli._stopped_before_work(words) == code
    document = json.loads(summary.read_text())
    check_schema(document)
    assert (document["runId"], document["exitCode"], document["input"]) == ("r-1", code, None)
    assert document["stopped"] == "signal, before the service had started"
    assert document["frames"]["received"] == 0 and document["transitions"] == []
    assert "summary (stopped: signal, before" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_a_fault_of_ours_mid_run_leaves_the_summary_there_is_and_is_not_hidden(
    tmp_path, monkeypatch
):
    summary = tmp_path / "summary.json"

    async def broken(self):
        raise RuntimeError("a bug")

    monkeypatch.setattr("pipelines.cli.run.DmsService.finished", broken)
    with pytest.raises(Exception, match=r"a bug|unhandled errors"):
        main(["run", *CPU, "--frames", "3", "--summary-json", str(summary)])
    document = json.loads(summary.read_text())
    check_schema(document)
    assert document["exitCode"] == 1 and document["error"] == "RuntimeError: a bug"
    assert document["runId"]


@pytest.mark.timeout(120)
def test_a_summary_that_cannot_be_written_fails_the_run(tmp_path, capsys, monkeypatch):
    summary = tmp_path / "summary.json"

    def full(path, record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pipelines.cli.run.write_summary_json", full)
    assert main(["run", *CPU, "--frames", "10", "--summary-json", str(summary)]) == ExitCode.FAILED
    assert "the summary could not be written" in capsys.readouterr().err


@pytest.mark.parametrize("taken", ["camera", "jsonl"])
def test_the_summary_document_is_refused_a_file_the_run_reads_or_writes(taken, tmp_path, capsys):
    recording = tmp_path / "in.dmsrec"
    cabin_recording(recording, [0], 0)
    before = recording.read_bytes()
    jsonl = tmp_path / "out.jsonl"
    target = recording if taken == "camera" else jsonl
    argv = ["replay", str(recording), *CPU, "--jsonl", str(jsonl), "--summary-json", str(target)]
    assert main(argv) == ExitCode.REFUSED
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"is the --{taken} file" in err[0], err
    assert recording.read_bytes() == before and not jsonl.exists()


@pytest.mark.timeout(120)
def test_a_standard_output_whose_reader_has_gone_still_gets_the_summary_json_and_no_traceback(
    tmp_path,
):
    summary = tmp_path / "summary.json"
    with subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "run", *CPU, "--frames", "5",
         "--summary-json", str(summary)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    ) as child:  # fmt: skip
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # the reader leaves before the summary is printed
        stderr = child.stderr.read()
        child.wait(timeout=100)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr[-2000:]
    assert "frames received      5" in stderr  # printed where someone still reads
    check_schema(json.loads(summary.read_text()))


def test_importing_the_command_line_loads_none_of_the_runtime():
    """The entry point installs its signal handling first thing: whatever the module imports
    before that is a window in which Ctrl-C is not the command's (a signal then could be lost)."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys, pipelines.cli; print(sorted("
         "m for m in ('aio_runtime', 'numpy', 'anyio') if m in sys.modules))"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

"""``aio-dms run`` and ``replay`` in openpilot's formats: ``--rlog PATH`` and ``--cereal-zmq
[HOST]`` — what they write and publish, and what they refuse."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from test_dms_service_io import cabin_recording

from pipelines.cli import main, parse_args
from pipelines.dms.openpilot.events import DRIVER_STATE, STATUS, read_events
from pipelines.dms.openpilot.logs import read_log
from pipelines.dms.sinks.cereal import cereal_port
from pipelines.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parent.parent
CPU = ["--device", "cpu", "--calib", "0,0,0", "--health-port", "-1", "--budget", "2"]
"""The model on the CPU, a static calibration, no health port, a budget no busy machine misses."""


def _sinks(summary: Path) -> dict[str, dict]:
    return {sink["name"]: sink for sink in json.loads(summary.read_text())["sinks"]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["rlog.zst", "rlog.bz2", "rlog"])
def test_a_replay_writes_every_published_message_to_the_log_as_the_json_lines_say(
    name, tmp_path, capsys
):
    recording, log = tmp_path / "in.dmsrec", tmp_path / name
    lines_path, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    cabin_recording(recording, list(range(30)), 0)
    argv = ["replay", str(recording), *CPU, "--rlog", str(log), "--jsonl", str(lines_path),
            "--faults", "nan-output@10+3", "--summary-json", str(summary)]  # fmt: skip
    assert main(argv) == ExitCode.OK, capsys.readouterr().err
    lines = [json.loads(line) for line in lines_path.read_text().splitlines()]
    events = list(read_log(log))
    statuses = [e.dmsStatus for e in events if e.which() == STATUS]
    states = [e for e in events if e.which() == DRIVER_STATE]
    assert [s.seq for s in statuses] == [line["seq"] for line in lines] == list(range(30))
    assert [s.frameId for s in statuses] == [line["frameId"] for line in lines]
    assert [e.driverStateV2.frameId for e in states] == [line["frameId"] for line in lines]
    assert [s.valid for s in statuses] == [line["valid"] for line in lines]
    for event, line in zip(states, lines, strict=True):
        if line["leftDriverData"] is not None:
            assert event.driverStateV2.leftDriverData.faceProb == pytest.approx(
                line["leftDriverData"]["faceProb"]
            )
        with_data = line["leftDriverData"] is not None
        assert event.valid == (with_data and line["availability"] != "unavailable")
    sink = _sinks(summary)[f"rlog {log}"]
    assert (sink["published"], sink["delivered"], sink["dropped"]) == (30, 30, 0)  # none lost
    assert f"sink rlog {log}" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_a_run_publishes_driver_states_on_45495_for_a_cereal_subscriber(tmp_path):
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("tcp://127.0.0.1:45495")  # before the publisher binds: ZeroMQ reconnects
    summary = tmp_path / "summary.json"
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "run", *CPU, "--frames", "60", "--cereal-zmq",
             "--summary-json", str(summary)],
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        ) as child:  # fmt: skip
            frames = [sub.recv_multipart() for _ in range(10) if sub.poll(30_000)]
            _, err = child.communicate(timeout=100)
    finally:
        sub.close(linger=0)
        context.term()
    assert child.returncode == ExitCode.OK, err[-2000:]
    assert "cereal driverStateV2: tcp://127.0.0.1:45495" in err
    assert "cereal dmsStatus: tcp://127.0.0.1:53156" in err
    assert len(frames) == 10 and all(len(parts) == 1 for parts in frames)  # no topic frame
    events = [next(iter(read_events(parts[0]))) for parts in frames]
    assert {e.which() for e in events} == {DRIVER_STATE}
    ids = [e.driverStateV2.frameId for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 10
    sinks = _sinks(summary)
    for service, port in ((DRIVER_STATE, 45495), (STATUS, 53156)):
        counted = sinks[f"cereal {service} tcp://127.0.0.1:{port}"]
        assert counted["published"] == counted["delivered"] + counted["dropped"] > 0


@pytest.mark.timeout(120)
def test_a_cereal_port_in_use_is_one_line_naming_it_and_its_option(capsys):
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 45495))
        taken.listen()
        code = main(["run", *CPU, "--frames", "3", "--cereal-zmq"])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(err) == 1 and "45495" in err[0] and "[--cereal-zmq]" in err[0], err


@pytest.mark.timeout(120)
def test_a_remote_cereal_host_is_refused_without_allow_remote(capsys):
    code = main(["run", *CPU, "--frames", "3", "--cereal-zmq", "192.0.2.1"])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(err) == 1 and "not a loopback address" in err[0] and "--allow-remote" in err[0]


def test_the_cereal_host_is_loopback_when_left_out_and_as_given_otherwise():
    bare = parse_args(["run", "--cereal-zmq", "--frames", "3"])
    given = parse_args(["replay", "in.dmsrec", "--cereal-zmq", "::1"])
    off = parse_args(["run"])
    assert (bare.cereal_zmq, given.cereal_zmq, off.cereal_zmq) == ("127.0.0.1", "::1", None)


@pytest.mark.timeout(120)
def test_a_log_that_exists_is_refused_before_any_work(tmp_path, capsys):
    log = tmp_path / "rlog.zst"
    log.write_bytes(b"an earlier run's")
    code = main(["run", *CPU, "--frames", "5", "--rlog", str(log)])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(err) == 1 and "exists" in err[0] and str(log) in err[0], err
    assert log.read_bytes() == b"an earlier run's"


def test_the_summary_document_is_refused_the_log_file(tmp_path, capsys):
    path = tmp_path / "rlog"
    code = main(["run", *CPU, "--frames", "5", "--rlog", str(path), "--summary-json", str(path)])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED and len(err) == 1 and "--rlog" in err[0], err
    assert not path.exists()


def test_the_help_names_the_ports_the_rule_gives(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"driverStateV2 on {cereal_port(DRIVER_STATE)}" in text
    assert f"dmsStatus on {cereal_port(STATUS)}" in text


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["replay", "--cereal-zmq", "drive/route--4"], True),  # the segment taken as the host
        (["replay", "--cereal-zmq"], False),
        (["replay"], False),
    ],
)
def test_a_replay_without_its_input_says_so_and_what_took_it(argv, hint, capsys):
    assert main(argv) == ExitCode.REFUSED
    err = capsys.readouterr().err.splitlines()
    assert err == [err[-1]] and err[-1].startswith("aio-dms replay: INPUT is required")
    assert ("--cereal-zmq took 'drive/route--4' as its host" in err[-1]) is hint

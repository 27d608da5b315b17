from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import structlog
from quiet_host import unconfigured_logging

from aio_runtime import (
    LogEvent,
    ModelTimeout,
    configure_logging,
    get_logger,
    log_context,
    run_in_thread,
)
from aio_runtime.testing import capture_logs

ROOT = Path(__file__).resolve().parent.parent


class Records(logging.Handler):
    """A host's own handler: keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def host_handler():
    """A handler on the ``pipelines`` logger, at every level, as a host would add one."""
    logger = logging.getLogger("pipelines")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_json_mode_writes_one_json_object_per_event_with_bound_context():
    stream = io.StringIO()
    assert configure_logging("json", stream=stream)
    with log_context(frame_id=42, stage="warp", device="sim0"):
        get_logger("test").info("frame warped", took_ms=0.8)
    event = json.loads(stream.getvalue().strip())
    assert event["event"] == "frame warped"
    assert (event["frame_id"], event["stage"], event["device"]) == (42, "warp", "sim0")
    assert event["level"] == "info"
    assert event["logger_name"] == "test"
    assert event["took_ms"] == 0.8
    assert "timestamp" in event


def test_configuration_happens_once_unless_forced():
    first, second = io.StringIO(), io.StringIO()
    assert configure_logging("json", stream=first)
    assert not configure_logging("console", stream=second)
    get_logger("t").info("still json")
    assert json.loads(first.getvalue())["event"] == "still json"
    assert configure_logging("console", stream=second, force=True)
    get_logger("t").info("now console")
    assert "now console" in second.getvalue()
    assert not second.getvalue().startswith("{")
    assert "now console" not in first.getvalue()  # the first handler was replaced


def test_level_filters_events():
    stream = io.StringIO()
    configure_logging("json", stream=stream, level="warning")
    get_logger("t").info("dropped")
    get_logger("t").warning("kept")
    lines = stream.getvalue().strip().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["kept"]


def test_bad_mode_or_level_is_a_clear_error():
    with pytest.raises(ValueError, match="mode"):
        configure_logging("xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level"):
        configure_logging("json", level="loud")


def test_context_is_removed_after_the_block():
    with capture_logs() as entries:
        with log_context(frame_id=1, stage=None):
            get_logger("t").info("inside")
        get_logger("t").info("outside")
    assert entries[0]["frame_id"] == 1 and "stage" not in entries[0]
    assert "frame_id" not in entries[1]


@pytest.mark.anyio
async def test_context_reaches_tasks_started_inside_the_block_and_worker_threads(host_handler):
    log = get_logger("pipelines.dms.stage")

    async def child() -> None:
        log.info("in a child task")

    with log_context(frame_id=3, stage="model"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(child)
        await run_in_thread(
            lambda: log.info("on a worker thread"), awaited="x", error=ModelTimeout, timeout=5
        )
    log.info("after")
    contexts = [
        (r.msg["event"], r.msg.get("frame_id"), r.msg.get("stage")) for r in host_handler.records
    ]
    assert contexts == [
        ("in a child task", 3, "model"),
        ("on a worker thread", 3, "model"),
        ("after", None, None),
    ]


def test_bad_arguments_are_rejected_even_when_already_configured():
    assert configure_logging("json", stream=io.StringIO())
    with pytest.raises(ValueError, match="mode"):
        configure_logging("xml")  # type: ignore[arg-type]


def test_unconfigured_the_runtimes_loggers_write_nothing_at_all(capfd):
    with unconfigured_logging():
        for name in ("aio_runtime.health", "transports.gpu.session", "pipelines.dms.sinks.jsonl"):
            log = get_logger(name)
            log.info("an event")
            log.warning("a warning")  # Python's last-resort handler would print this one
            log.error("an error", error="DeviceLost: gone")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_a_hosts_handler_receives_each_record_with_its_fields_and_context(host_handler):
    log = get_logger("pipelines.dms.example")
    with log_context(frame_id=7, device="sim0"):
        log.warning("sink dropping messages", sink="zmq", dropped=3)
    [record] = host_handler.records
    assert (record.name, record.levelno) == ("pipelines.dms.example", logging.WARNING)
    assert isinstance(record.msg, LogEvent)
    assert record.msg == {
        "event": "sink dropping messages",
        "sink": "zmq",
        "dropped": 3,
        "frame_id": 7,
        "device": "sim0",
    }
    text = record.getMessage()  # one line: the event, then its fields in any order
    assert text.startswith("sink dropping messages ")
    fields = text.removeprefix("sink dropping messages ").split(" ")
    assert sorted(fields) == ["device='sim0'", "dropped=3", "frame_id=7", "sink='zmq'"]
    assert record.pathname == __file__  # where it was logged, not structlog's frames


def test_an_exception_logged_is_the_records_exc_info(host_handler):
    error = KeyError("lost")
    try:
        raise error
    except KeyError as exc:
        get_logger("pipelines.x").error("session failed", exc_info=exc)
        get_logger("pipelines.x").exception("session failed again")
    for record in host_handler.records:
        assert record.exc_info is not None and record.exc_info[1] is error
        assert record.msg["exc_info"] is error  # taken as it was logged, not as it is formatted
        assert record.levelno == logging.ERROR and record.pathname == __file__
        text = logging.Formatter().format(record)
        assert text.startswith("session failed") and "KeyError: 'lost'" in text
    assert len(host_handler.records) == 2


def test_stdlib_levels_on_a_package_logger_silence_it(host_handler):
    logging.getLogger("pipelines").setLevel(logging.ERROR)
    log = get_logger("pipelines.dms.service._outcomes")
    log.info("availability", state="available")
    log.warning("camera slow")
    log.error("camera failed")
    assert [r.msg["event"] for r in host_handler.records] == ["camera failed"]


def test_a_hosts_own_structlog_configuration_does_not_reach_these_loggers(host_handler):
    seen = []
    previous = structlog.get_config()
    structlog.configure(processors=[lambda _, __, event: seen.append(event) or event])
    try:
        get_logger("pipelines.y").info("ready")
    finally:
        structlog.configure(**previous)
    assert seen == []
    assert [r.msg["event"] for r in host_handler.records] == ["ready"]


def test_another_librarys_record_is_rendered_with_its_extra_fields():
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    logging.getLogger("hypercorn.error").warning("port %d busy", 9032, extra={"host": "::1"})
    event = json.loads(stream.getvalue())
    assert (event["event"], event["host"], event["level"]) == ("port 9032 busy", "::1", "warning")
    assert event["logger_name"] == "hypercorn.error"


def test_captured_logs_take_every_level_and_leave_the_root_level_as_it_was():
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    with capture_logs() as entries:
        get_logger("pipelines.z").debug("detail", n=1)
    assert entries == [
        {"event": "detail", "n": 1, "log_level": "debug", "logger_name": "pipelines.z"}
    ]
    assert root.level == logging.WARNING


@pytest.mark.timeout(120)
@pytest.mark.parametrize("log_format", ["console", "json"])
def test_the_cli_logs_to_standard_error_in_either_format(log_format):
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--frames", "10", "--calib", "0,0,0",
         "--budget", "0.5", "--health-port", "-1", "--log-format", log_format],
        capture_output=True, text=True, cwd=ROOT, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "session ready" in line]
    assert len(lines) == 1, result.stderr[-2000:]
    if log_format == "json":
        event = json.loads(lines[0])
        assert (event["event"], event["level"]) == ("session ready", "info")
        assert event["logger_name"] == "aio_runtime.supervision"
    else:
        assert "[info     ] session ready" in lines[0] and "[aio_runtime.supervision]" in lines[0]
    assert "session ready" not in result.stdout

from __future__ import annotations

import io
import json

import pytest
import structlog

from aio_runtime import configure_logging, get_logger, log_context
from aio_runtime._core import _log as log_module
from aio_runtime.testing import capture_logs


@pytest.fixture
def fresh_logging(monkeypatch):
    monkeypatch.setattr(log_module, "_configured", False)
    previous = structlog.get_config()
    yield
    structlog.configure(**previous)


def test_json_mode_writes_one_json_object_per_event_with_bound_context(fresh_logging):
    stream = io.StringIO()
    assert configure_logging("json", stream=stream)
    with log_context(frame_id=42, stage="warp", device="sim0"):
        get_logger("test").info("frame warped", took_ms=0.8)
    event = json.loads(stream.getvalue().strip())
    assert event["event"] == "frame warped"
    assert (event["frame_id"], event["stage"], event["device"]) == (42, "warp", "sim0")
    assert event["level"] == "info"
    assert event["logger_name"] == "test"
    assert "timestamp" in event


def test_configuration_happens_once_unless_forced(fresh_logging):
    first, second = io.StringIO(), io.StringIO()
    assert configure_logging("json", stream=first)
    assert not configure_logging("console", stream=second)
    get_logger("t").info("still json")
    assert json.loads(first.getvalue())["event"] == "still json"
    assert configure_logging("console", stream=second, force=True)
    get_logger("t").info("now console")
    assert "now console" in second.getvalue()
    assert not second.getvalue().startswith("{")


def test_level_filters_events(fresh_logging):
    stream = io.StringIO()
    configure_logging("json", stream=stream, level="warning")
    get_logger("t").info("dropped")
    get_logger("t").warning("kept")
    lines = stream.getvalue().strip().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["kept"]


def test_bad_mode_or_level_is_a_clear_error(fresh_logging):
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


def test_bad_arguments_are_rejected_even_when_already_configured(fresh_logging):
    assert configure_logging("json", stream=io.StringIO())
    with pytest.raises(ValueError, match="mode"):
        configure_logging("xml")  # type: ignore[arg-type]

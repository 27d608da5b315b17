"""The driverStateV2 message and its sinks: in-process subscriptions, ZeroMQ, JSON lines."""

from __future__ import annotations

import base64
import json
import select
import subprocess
import sys
import textwrap

import anyio
import numpy as np
import pytest

from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2
from pipelines.dms.publish import JsonLinesSink, Subscriptions, ZmqSink

pytestmark = pytest.mark.anyio

READY = dict.fromkeys(READINESS_LAYERS, True)


def driver(value: float = 0.25) -> dict[str, object]:
    data: dict[str, object] = dict.fromkeys(DRIVER_FIELDS, np.float32(value))
    data["faceOrientation"] = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    data["faceOrientationStd"] = [1.0, 1.0, 1.0]
    data["facePosition"] = [0.0, -0.1]
    data["facePositionStd"] = [0.5, 0.5]
    return data


def message(seq: int = 0, *, valid: bool = True, raw: bytes | None = None) -> DriverStateV2:
    return DriverStateV2(
        seq=seq,
        frame_id=100 + seq,
        timestamp_sof=1_000_000_000 + seq,
        timestamp_eof=1_000_500_000 + seq,
        frame_age=0.012,
        availability="available" if valid else "unavailable",
        reason="" if valid else "gpu-queue: compute timeline >= 5: timed out",
        valid=valid,
        readiness=READY if valid else {**READY, "taskComplete": False, "outputValid": False},
        model_execution_time=0.009,
        gpu_execution_time=0.008,
        wheel_on_right_prob=0.01 if valid else None,
        left_driver_data=driver() if valid else None,
        right_driver_data=driver(0.5) if valid else None,
        raw_predictions=raw,
    )


def test_the_record_uses_openpilot_names_plus_ours():
    raw = np.arange(4, dtype="<f4").tobytes()
    record = message(raw=raw).to_record()
    assert record["frameId"] == 100 and record["seq"] == 0
    assert record["leftDriverData"]["faceOrientation"] == pytest.approx([0.1, 0.2, 0.3])
    assert record["rightDriverData"]["phoneProb"] == 0.5
    assert set(record["readiness"]) == set(READINESS_LAYERS)
    assert np.frombuffer(base64.b64decode(record["rawPredictions"]), "<f4").tolist() == [0, 1, 2, 3]
    assert "rawPredictions" not in message().to_record()  # only when enabled
    assert json.loads(message().to_json())["valid"] is True


def test_an_invalid_message_says_why_and_carries_no_driver_data():
    record = message(valid=False).to_record()
    assert record["valid"] is False and record["leftDriverData"] is None
    assert record["reason"].startswith("gpu-queue")


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"availability": "fine"}, "availability"),
        ({"readiness": {"deviceOnline": True}}, "readiness lacks"),
        ({"left_driver_data": {"faceProb": 1.0}}, "exactly the fields"),
        ({"left_driver_data": None}, "valid message carries driver data"),
    ],
)
def test_malformed_messages_are_refused_with_what_was_expected(change, complaint):
    fields = {**message().__dict__, **change}
    with pytest.raises(ValueError, match=complaint):
        DriverStateV2(**fields)


async def test_subscribers_get_every_message_in_order_and_a_slow_one_loses_the_oldest():
    subscriptions = Subscriptions()
    got: list[int] = []
    slow: list[int] = []

    async def reader():
        async for m in subscriptions.subscribe():
            got.append(m.seq)

    async def slow_reader(ready):
        stream = subscriptions.subscribe(backlog=2)
        first = anext(stream)
        ready.set()
        slow.append((await first).seq)
        async for m in stream:
            slow.append(m.seq)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            ready = anyio.Event()
            tg.start_soon(slow_reader, ready)
            await ready.wait()
            await anyio.sleep(0.01)
            for seq in range(5):
                subscriptions.publish(message(seq))
            subscriptions.close()
    assert got == [0, 1, 2, 3, 4]
    assert slow == [3, 4]  # a backlog of 2: the oldest went (the gap shows in seq)


def test_json_lines_go_to_a_file_one_record_per_line(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = JsonLinesSink(path)
    for seq in range(3):
        sink.publish(message(seq))
    sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2]


def test_zeromq_refuses_a_non_loopback_address_unless_asked():
    with pytest.raises(ValueError, match="not a loopback"):
        ZmqSink("tcp://0.0.0.0:0")
    ZmqSink("tcp://127.0.0.1:0").close()


SUBSCRIBER = textwrap.dedent(
    """
    import json, sys, zmq
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"driverStateV2")
    socket.setsockopt(zmq.RCVTIMEO, 10000)
    socket.connect(sys.argv[1])
    seen, joined = [], False
    while len(seen) < 3:
        topic, body = socket.recv_multipart()
        seq = json.loads(body)["seq"]
        if seq >= 1000:  # a probe: the subscription has reached the publisher
            if not joined:
                print("joined", flush=True)
                joined = True
            continue
        seen.append(seq)
    print(json.dumps(seen), flush=True)
    """
)


def test_zeromq_reaches_a_subscriber_in_another_process():
    sink = ZmqSink("tcp://127.0.0.1:0")
    child = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, sink.address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        # ZeroMQ's slow joiner: probe until the subscriber says a probe arrived.
        for probe in range(1000, 2000):
            sink.publish(message(probe))
            if select.select([child.stdout], [], [], 0.01)[0]:
                break
        assert child.stdout.readline().strip() == "joined"
        for seq in range(3):
            sink.publish(message(seq))
        out, _ = child.communicate(timeout=15)
        assert json.loads(out.strip()) == [0, 1, 2]
    finally:
        child.kill()
        sink.close()


def test_a_json_lines_sink_that_cannot_write_fails_alone(tmp_path):
    sink = JsonLinesSink("/dev/full")
    for seq in range(5):
        sink.publish(message(seq))  # never raises, never blocks
    sink.close()
    assert sink.failed is not None and "OSError" in sink.failed
    sink.publish(message(9))
    assert sink.dropped >= 1

"""Every published message carries its run's id: fresh per start of the service unless given,
the same on every sink."""

from __future__ import annotations

import json

import pytest
from dms_messages import RUN_ID, message
from test_dms_service import run
from test_dms_sink_zmq import join, subscriber  # noqa: F401 (a fixture)

from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.sinks.zmq import TOPIC, ZmqSink

CPU = {"device": "cpu", "calib": (0.0, 0.0, 0.0), "budget": 2.0, "health_port": None}


@pytest.mark.anyio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_every_message_of_a_run_carries_one_run_id_and_the_next_run_another(tmp_path):
    ids = []
    for k in range(2):
        jsonl = tmp_path / f"run{k}.jsonl"
        config = ServiceConfig(jsonl=str(jsonl), mode="replay", **CPU)
        service, messages = await run(config, SyntheticCamera(fps=200, frames=5))
        lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
        assert len(lines) == len(messages) == 5
        assert {line["runId"] for line in lines} == {m.run_id for m in messages} == {service.run_id}
        ids.append(service.run_id)
    assert ids[0] != ids[1]


@pytest.mark.anyio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_run_id_given_is_the_one_every_message_carries():
    config = ServiceConfig(run_id="bench-7.a:1", mode="replay", **CPU)
    service, messages = await run(config, SyntheticCamera(fps=200, frames=3))
    assert service.run_id == "bench-7.a:1"
    assert [m.to_record()["runId"] for m in messages] == ["bench-7.a:1"] * 3


@pytest.mark.timeout(60)
def test_zeromq_subscribers_receive_the_run_id_in_each_record(subscriber):  # noqa: F811
    sink = ZmqSink("tcp://127.0.0.1:0")
    try:
        socket = subscriber(sink.address)
        join(sink, socket)
        sink.publish(message(5))
        while True:
            topic, body = socket.recv_multipart()
            record = json.loads(body)
            if record["seq"] == 5:
                break
        assert topic == TOPIC and record["runId"] == RUN_ID
    finally:
        sink.close(timeout=0)


@pytest.mark.parametrize(
    "given", ["", "-x", "a b", "x" * 65, "id/1", "ü", 5, b"id"], ids=lambda v: repr(v)[:20]
)
def test_a_run_id_that_would_not_read_back_as_one_word_is_refused(given):
    with pytest.raises(ValueError, match="run_id must be 1 to 64 letters, digits"):
        ServiceConfig(run_id=given)

"""The example programs run and do what they say, and docs/service.md shows them as they are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str) -> list[str]:
    """The example's lines on standard output (this checkout's code, whatever is installed)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def health_port(lines: list[str]) -> int:
    found = [re.fullmatch(r"health: http://127\.0\.0\.1:(\d+)/", line) for line in lines]
    ports = [int(match[1]) for match in found if match]
    assert len(ports) == 1 and ports[0] != 0, lines
    return ports[0]


@pytest.mark.timeout(120)
def test_the_asyncio_embedding_example_sees_the_service_fail_and_recover_then_stops_it():
    lines = run_example("embed_asyncio.py")
    health_port(lines)
    states = [line for line in lines if line.startswith("availability:")]
    failed = [i for i, s in enumerate(states) if "unavailable(" in s and "gpu-queue" in s]
    assert failed, states
    frames = [line for line in lines if re.match(r"message \d+: ", line)]
    assert len(frames) == 2, lines
    hung, recovered = (re.match(r"message (\d+): (.*)", line).groups() for line in frames)
    assert hung[1] == "unavailable, gpu-queue"  # the availability and its reason's kind
    # valid again: the availability beside it follows the host's speed as well (on a busy host
    # it may say overloaded), so only that it is one is asserted
    again, availability = recovered[1].split(", ")
    assert again == "valid again" and int(recovered[0]) > int(hung[0])
    assert availability in {"available", "degraded", "unavailable"}
    # stopped by leaving the block: the service has no frame limit
    valid, invalid = map(
        int, re.fullmatch(r"stopped; messages: (\d+) valid, (\d+) invalid", lines[-1]).groups()
    )
    assert valid > 0 and invalid > 0


@pytest.mark.timeout(120)
def test_the_trio_embedding_example_is_refused_a_port_in_use_and_follows_a_camera_stall():
    lines = run_example("embed_trio.py")
    port = health_port(lines)
    refused = [line for line in lines if line.startswith("a second service cannot start")]
    assert len(refused) == 1 and refused[0].startswith(
        f"a second service cannot start (health_port): health endpoints on 127.0.0.1 port {port}:"
    ), lines
    states = [line for line in lines if line.startswith("availability:")]
    stalled = [i for i, s in enumerate(states) if s.startswith("availability: unavailable(camera")]
    assert stalled and states[-1] == "availability: available", states
    assert lines[-1] == "stopped"


def example_code(name: str) -> str:
    """An example as the docs show it: its code after the docstring and the future import."""
    text = (ROOT / "examples" / name).read_text()
    return text.split("from __future__ import annotations\n\n", 1)[1].strip("\n")


def test_the_docs_show_the_embedding_examples_as_they_are():
    page = (ROOT / "docs" / "service.md").read_text()
    section = page.split("## Embedding the DMS service\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)\n```", section, re.S)
    assert blocks == [example_code("embed_asyncio.py"), example_code("embed_trio.py")]

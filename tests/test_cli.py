from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


def test_demo_shows_timeouts_unavailability_and_recovery():
    result = run("-m", "pipelines.cli", "demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "availability -> available" in out
    assert re.search(r"availability -> unavailable\(.*SignalTimeout: \[gpu-queue\]", out)
    assert re.search(
        r"availability -> unavailable\(.*FirmwareTimeout: \[firmware\] SMU mailbox", out
    )
    assert out.strip().splitlines()[-1].startswith("demo done:")
    assert "nothing left allocated" in out


def test_cli_without_a_command_is_a_usage_error():
    result = run("-m", "pipelines.cli")
    assert result.returncode == 2
    assert "usage: aio-dms" in result.stderr


def readme_example(index: int = 0) -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    if len(blocks) <= index:
        pytest.fail(f"README.md has no python example #{index + 1}")
    return blocks[index]


def test_readme_example_runs_and_prints_what_it_says(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    result = run(str(script))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "completed: 1"
    assert lines[1].startswith(
        "frame budget: [gpu-queue] timeline signal 'gpu0 compute' >= 2: budget 'frame 2' exhausted"
    )
    assert lines[2] == "hardware timeout: gpu-queue expected=2 observed=1"


def test_readme_transports_example_runs_and_prints_what_it_says(tmp_path):
    script = tmp_path / "transports_example.py"
    script.write_text(readme_example(1))
    result = run(str(script))
    assert result.returncode == 0, result.stderr
    printed = [
        line
        for line in result.stdout.splitlines()
        if line.split(":")[0] in ("doubled", "hung kernel", "recovered")
    ]
    assert printed == [
        "doubled: True",
        "hung kernel: gpu-queue compute timeline >= 2",
        "recovered: True",
    ]

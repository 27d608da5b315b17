from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
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


def test_model_info_prints_the_reference_models_contract_as_json(tmp_path):
    result = run("-m", "pipelines.cli", "model-info", env={"AIO_DMS_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["inputs"] == [
        {"name": "input_img", "shape": [1, 1382400], "dtype": "uint8"},
        {"name": "calib", "shape": [1, 3], "dtype": "float32"},
    ]
    assert info["output"] == {
        "name": "outputs",
        "shape": [1, 553],
        "dtype": "float32",
        "length": 553,
    }
    assert info["output_slices"]["face_descs_lhd"] == [0, 12]
    assert info["output_slices"]["wheel_on_right"] == [40, 41]
    assert info["output_slices"]["features"] == [41, 553]
    assert "untrained" in info["model_checkpoint"]
    assert Path(info["path"]).parent == tmp_path  # built into the cache folder


def test_model_info_reads_a_model_by_path_and_explains_a_mismatch(tmp_path):
    from onnx import TensorProto, helper

    from pipelines.dms.model.reference import build_reference_model, write_model

    good = write_model(build_reference_model(seed=5), tmp_path / "seed5.onnx")
    result = run("-m", "pipelines.cli", "model-info", "--model", str(good))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["path"] == str(good)

    model = build_reference_model()
    model.graph.input[1].CopyFrom(helper.make_tensor_value_info("calib", TensorProto.FLOAT, [1, 4]))
    bad = write_model(model, tmp_path / "bad.onnx")
    result = run("-m", "pipelines.cli", "model-info", "--model", str(bad))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "model input 'calib' (1, 4) float32; expected 'calib' (1, 3) float32" in result.stderr

    # A model that is not there is refused before any work, as run and replay refuse it.
    result = run("-m", "pipelines.cli", "model-info", "--model", str(tmp_path / "missing.onnx"))
    assert result.returncode == 2
    assert result.stderr.strip().endswith("no such file (expected an ONNX model file)")
    result = run("-m", "pipelines.cli", "model-info", "--model", str(tmp_path))
    assert result.returncode == 2 and "a directory (expected an ONNX model file)" in result.stderr


def docs_example(page: str, index: int = 0) -> str:
    """The python example #index + 1 of a documentation page (docs/PAGE), as the page shows it."""
    text = (ROOT / "docs" / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    if len(blocks) <= index:
        pytest.fail(f"docs/{page} has no python example #{index + 1}")
    return blocks[index]


def test_the_cores_example_runs_and_prints_what_it_says(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(docs_example("core.md"))
    result = run(str(script))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "completed: 1"
    assert lines[1].startswith(
        "frame budget: [gpu-queue] timeline signal 'gpu0 compute' >= 2: budget 'frame 2' exhausted"
    )
    assert lines[2] == "hardware timeout: gpu-queue expected=2 observed=1"


def test_the_transports_example_runs_and_prints_what_it_says(tmp_path):
    script = tmp_path / "transports_example.py"
    script.write_text(docs_example("transports.md"))
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


@pytest.mark.timeout(120)
def test_aio_dms_run_prints_a_summary_and_writes_json_lines(tmp_path):
    out = tmp_path / "out.jsonl"
    result = run(
        "-m", "pipelines.cli", "run", "--device", "cpu", "--frames", "30", "--calib", "0,0,0",
        "--health-port", "-1", "--jsonl", str(out), "--faults", "nan-output@10+3",
        "--budget", "2",  # not about lateness: no frame of a busy machine's is late
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = result.stdout
    assert re.search(r"frames received\s+30\b", summary)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seq"] for r in records] == list(range(len(records)))
    # the faulted frames that were published (live, a loaded host drops some, counted as such)
    nan = {10, 11, 12} & {r["frameId"] for r in records}
    assert (
        nan and {r["frameId"] for r in records if r["reason"].startswith("invalid output")} == nan
    )
    assert re.search(rf"\b{len(nan)}\s+invalid output\b", summary)  # counted by the reason's kind
    assert records[-1]["valid"] and records[-1]["leftDriverData"]["faceProb"] is not None


def test_aio_dms_run_refuses_bad_options_with_what_was_expected(tmp_path):
    missing = run("-m", "pipelines.cli", "run", "--camera", str(tmp_path / "none.mp4"))
    assert missing.returncode == 2 and "no such file (expected 'synthetic'" in missing.stderr
    faults = run("-m", "pipelines.cli", "run", "--faults", "gpu-melt@3")
    assert faults.returncode == 2 and "gpu-melt" in faults.stderr


@pytest.mark.timeout(120)
def test_aio_dms_run_exits_non_zero_when_the_camera_fails(tmp_path):
    broken = tmp_path / "broken.dmsrec"
    broken.write_bytes(b"DMSNV12\x00\x01")  # a recording cut short in its header
    result = run("-m", "pipelines.cli", "run", "--camera", str(broken), "--health-port", "-1")
    assert result.returncode == 1
    assert "the camera failed: ReplayFormatError" in result.stderr
    assert re.search(r"frames received\s+0\b", result.stdout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_aio_dms_run_stops_gracefully_on_a_signal(signum):
    child = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "run", "--device", "cpu", "--duration", "60",
         "--calib", "0,0,0", "--health-port", "-1", "--log-format", "json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stderr is not None
        for line in child.stderr:  # runs until the service publishes valid frames
            if '"state": "available"' in line:
                break
        else:
            raise AssertionError("the service never became available")
        child.send_signal(signum)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 0, err[-2000:]
    received = int(re.search(r"frames received\s+(\d+)", out).group(1))
    assert received > 0  # the summary is printed, every frame accounted for (checked before it)

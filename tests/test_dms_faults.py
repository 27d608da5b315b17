"""The --faults script."""

from __future__ import annotations

import pytest

from pipelines.dms.config.faults import FAULT_NAMES, FaultSpec, parse_faults
from transports.sim import Fault


def test_a_script_parses_into_frame_windows():
    faults = parse_faults("gpu-hang@40+20, camera-stall@100")
    assert faults == [FaultSpec("gpu-hang", 40, 20), FaultSpec("camera-stall", 100, 1)]
    assert faults[0].device is Fault.KERNEL_HANG and faults[1].device is None
    assert [f for f in range(35, 65) if faults[0].active(f)] == list(range(40, 60))
    assert parse_faults("") == []


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("gpu-hang", "expected NAME@FRAME"),
        ("gpu-hang@x", "expected NAME@FRAME"),
        ("melt@3", "unknown fault 'melt'"),
        ("gpu-hang@3+0", "at least one frame"),
    ],
)
def test_a_bad_script_says_what_was_expected(spec, complaint):
    with pytest.raises(ValueError, match=complaint):
        parse_faults(spec)


def test_every_fault_the_issue_names_is_known():
    for name in (
        "gpu-hang", "usb-timeout", "usb-disconnect", "fence-stall",
        "smu-timeout", "camera-stall", "nan-output",
    ):  # fmt: skip
        assert name in FAULT_NAMES

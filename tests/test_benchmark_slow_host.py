"""The slow-host benchmark's verdicts (benchmarks/slow_host.py): a service that was never
AVAILABLE meets a target only where being UNAVAILABLE is the right answer (below its minimum
rate, under half a CPU), and a case that published no valid frame is not measured."""

from __future__ import annotations

from typing import Any

from benchmarks.slow_host import TARGETS, verdicts


def case(condition: str, **service: Any) -> dict[str, Any]:
    figures = {
        "available": True,
        "working": True,
        "valid_share": 1.0,
        "late_share": 0.0,
        "published_valid": 1.0,
        "unavailable": 0,
        "unavailable_rate": 0,
        "rate_stated_below": True,
        "valid_fps": 20.0,
        "age_p99_ms": 50.0,
        "cpu_ms_a_frame": 30.0,
        "untrue": 0,
        **service,
    }
    return {"input": "cpu", "condition": condition, "realtime": None, "service": figures,
            "sync": None}  # fmt: skip


def test_never_available_is_a_miss_except_below_the_minimum_rate_at_half_a_cpu():
    assert verdicts([case("quiet")])["targets_met"]
    assert not verdicts([case("quiet", available=False)])["targets_met"]
    assert not verdicts([case("busy", available=False)])["targets_met"]
    slow = {"available": False, "valid_fps": TARGETS["quota_05_valid_fps"] + 1}
    out = verdicts([case("quota 0.5", **slow)])
    assert out["targets_met"] and out["cpu_quota_05_available"] is False


def test_at_half_a_cpu_the_rate_and_the_published_share_are_the_targets():
    assert not verdicts([case("quota 0.5", valid_fps=TARGETS["quota_05_valid_fps"] - 0.1)])[
        "targets_met"
    ]
    assert not verdicts([case("quota 0.5", published_valid=0.85)])["targets_met"]
    assert not verdicts([case("quota 0.5", unavailable=1)])["targets_met"]


def test_a_case_with_no_valid_frame_is_not_measured():
    out = verdicts([case("quota 0.5", available=False, working=False)])
    assert out == {"cpu_quota_05_measured": False, "targets_met": False}


def test_the_floor_is_each_input_s_quiet_cpu_time_a_frame_at_the_camera_s_rate():
    rows = [case("quiet", cpu_ms_a_frame=56.5), case("quota 1.0", cpu_ms_a_frame=48.0)]
    out = verdicts(rows)
    assert out["cpu_cpus_at_rate"] == 1.13  # more than a quota of 1.0 can give
    assert "cpu_cpus_at_rate" not in verdicts(rows[1:])  # only a quiet case says it

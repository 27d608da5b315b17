"""The service's configuration: each setting declared once, its text form parsed as the config is
made, pure checks apart from the machine's, and the command line generated from the declarations."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

import pytest

from pipelines.dms import config_values
from pipelines.dms.config import (
    CameraFile,
    DeviceKind,
    ServiceConfig,
    Synthetic,
    parse_camera,
    settings,
)
from pipelines.dms.faults import FaultSpec
from pipelines.dms.run import add_arguments, config_from


def parser(command: str = "run") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"aio-dms {command}")
    add_arguments(parser, command)
    return parser


def test_settings_given_as_text_are_parsed_once_as_the_config_is_made():
    config = ServiceConfig(
        camera="cabin.avi",
        device="cpu",
        faults="nan-output@3+2",
        calib="0.1,-0.2,0",
        model_cpus="auto",
        health_port="-1",
        model="m.onnx",
    )
    assert config.camera == CameraFile(Path("cabin.avi"))
    assert config.device is DeviceKind.CPU
    assert config.faults == (FaultSpec("nan-output", 3, 2),)
    assert config.calib == (0.1, -0.2, 0.0)
    assert config.model_cpus == "auto" and config.health_port is None
    assert config.model == Path("m.onnx")
    assert ServiceConfig().camera == Synthetic() and parse_camera("synthetic") == Synthetic()
    assert ServiceConfig(camera=Path("cabin.avi")).camera == CameraFile(Path("cabin.avi"))


def test_making_a_config_asks_nothing_of_the_machine_and_checking_it_does(tmp_path):
    missing = ServiceConfig(camera=str(tmp_path / "none.mp4"))  # no file is opened here
    with pytest.raises(ValueError, match="no such file"):
        missing.check_environment()
    present = tmp_path / "cabin.avi"
    present.write_bytes(b"")
    ServiceConfig(camera=str(present)).check_environment()


@pytest.mark.parametrize(
    ("settings_", "complaint"),
    [
        ({"budget": 0.0}, r"budget must be in \(0, 10\] seconds, got 0.0"),
        ({"recover_after": 0}, "recover_after must be at least 1 frame"),
        ({"gpu_hang_after": 61.0}, r"gpu_hang_after must be in \(0, 60\]"),
        ({"fence_timeout": -1.0}, "fence_timeout must be a finite number of seconds > 0"),
        ({"device": "gpu"}, "device must be 'sim' or 'cpu', got 'gpu'"),
        ({"calib": (0.0, 1.0)}, "calibration must be 3 finite numbers"),
        ({"device": "cpu", "faults": "gpu-hang@3"}, "accelerator faults need --device sim"),
        ({"model_cpus": "1;2"}, "model_cpus: expected auto, none or CPU numbers, got '1;2'"),
        (
            {"camera": ""},
            "camera: expected 'synthetic', a video file, a recording or an openpilot "
            "route segment directory, got ''",
        ),
        ({"health_port": 70000}, "health_port must be a port number"),
        ({"backoff_initial": 2.0, "backoff_max": 1.0}, "backoff_max must be at least"),
    ],
)
def test_a_bad_value_is_refused_with_what_was_expected(settings_, complaint):
    with pytest.raises(ValueError, match=complaint):
        ServiceConfig(**settings_)


def test_auto_model_cpus_are_the_last_cpu_for_the_cpu_runner_and_none_elsewhere():
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs and CPU placement")
    last = max(os.sched_getaffinity(0))
    assert ServiceConfig(device="cpu", model_cpus="auto").placed_cpus() == {last}
    assert ServiceConfig(device="sim", model_cpus="auto").placed_cpus() is None
    assert ServiceConfig(device="cpu").placed_cpus() is None  # the API places nothing unasked
    assert ServiceConfig(device="sim", model_cpus=(last,)).placed_cpus() is None  # checked only


def test_every_setting_has_an_option_whose_help_shows_its_default():
    for command in ("run", "replay"):
        text = " ".join(parser(command).format_help().split())  # argparse wraps lines
        for item, declared in settings():
            if declared.flag == "":  # set through another's option
                assert any(item.name in other.together for _, other in settings())
                continue
            if not declared.commands:  # the mode: set by the choice of command
                assert item.name == "mode"
                continue
            flag = declared.flag or "--" + item.name.replace("_", "-")
            shown = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None
            assert shown == (command in declared.commands), (command, flag)
            assert declared.help
        taken = sum(1 for _, d in settings() if d.flag != "" and command in d.commands)
        compare = 3 if command == "replay" else 0  # --compare, --tolerance, --max-disagreement
        assert text.count("(default: ") == taken + 2 + compare  # the log format, the summary file


def test_an_option_parsed_as_seconds_or_a_count_shows_so_unless_it_names_its_own_value():
    actions = {action.dest: action for action in parser("run")._actions}
    shown = {config_values.number: "SECONDS", config_values.integer: "N"}
    kinds = set()
    for item, declared in settings():
        if declared.parse in shown and item.name in actions:
            kinds.add(declared.parse)
            expected = declared.metavar or shown[declared.parse]
            assert actions[item.name].metavar == expected, item.name
    assert kinds == set(shown)  # both kinds are there to show


def test_options_given_on_the_command_line_reach_their_settings():
    args = parser().parse_args(
        [
            "--device", "cpu", "--budget", "0.2", "--backoff", "0.2", "3",
            "--threads", "2", "--health-port", "-1", "--raw-predictions",
            "--faults", "camera-stall@5", "--calib", "0,0,0", "--healthy-after", "2",
        ]
    )  # fmt: skip
    config = config_from(args)
    assert (config.device, config.budget, config.intra_op_threads) == (DeviceKind.CPU, 0.2, 2)
    assert (config.backoff_initial, config.backoff_max) == (0.2, 3.0)
    assert config.health_port is None and config.raw_predictions
    assert config.faults == (FaultSpec("camera-stall", 5),) and config.calib == (0.0, 0.0, 0.0)
    assert config.healthy_after == 2.0
    assert config.model_cpus == "auto"  # the command line's own default
    untouched = {"budget", "device", "backoff_initial", "backoff_max", "intra_op_threads",
                 "health_port", "raw_predictions", "faults", "calib", "healthy_after",
                 "model_cpus"}  # fmt: skip
    defaults = ServiceConfig()
    for item in dataclasses.fields(ServiceConfig):
        if item.name not in untouched:
            assert getattr(config, item.name) == getattr(defaults, item.name), item.name

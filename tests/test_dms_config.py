"""The service's configuration: each setting declared once, its text form parsed as the config is
made, pure checks apart from the machine's, and the command line generated from the declarations."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

import pytest

from pipelines.cli.run import add_arguments, config_from
from pipelines.dms.config import values as config_values
from pipelines.dms.config.faults import FaultSpec
from pipelines.dms.config.kinds import CameraFile, DeviceKind, Synthetic, parse_camera
from pipelines.dms.config.settings import ServiceConfig, settings


def arabic(digits: str) -> str:
    """``digits`` in Arabic-Indic digits, which Python's ``int()`` and ``float()`` read as
    numbers (``arabic("40")`` is U+0664 U+0660)."""
    return digits.translate(str.maketrans("0123456789", "".join(map(chr, range(0x660, 0x66A)))))


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


def test_the_backoff_is_bounded_by_a_few_minutes_first_delay_and_cap_alike():
    assert config_values.BACKOFF_LIMIT == 300
    top = ServiceConfig(backoff_initial=300, backoff_max=300)
    assert (top.backoff_initial, top.backoff_max) == (300, 300)
    for given in ({"backoff_initial": 1e308, "backoff_max": 1e308}, {"backoff_max": 301.0}):
        with pytest.raises(ValueError, match=r"must be in \(0, 300\] seconds, got") as refused:
            ServiceConfig(**given)
        assert "\n" not in str(refused.value)
    args = parser().parse_args(["--backoff", "1e308", "1e308"])
    with pytest.raises(ValueError, match="backoff_initial must be in"):
        config_from(args)
    assert "at most 300" in " ".join(parser().format_help().split())


NOT_WHOLE = [arabic("40"), arabic("0"), "1" + arabic("2"), "1_000", " 40", "40 ", "40\n", "+",
             "-", "", "4.0", "0x10"]  # fmt: skip
NOT_NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", "1_000.5", " 0.5", "0.5 ", "0.5\n",
               arabic("0.5"), "0." + arabic("5"), "0x1p-4", "", ".", "e5", "1e", "1e+", "--1",
               "\N{VULGAR FRACTION ONE HALF}"]  # fmt: skip


@pytest.mark.parametrize("text", NOT_WHOLE)
def test_a_whole_number_is_ascii_digits_with_an_optional_sign_only(text):
    with pytest.raises(ValueError, match="expected a whole number"):
        config_values.integer(text)
    with pytest.raises(ValueError):
        config_values.port(text)


@pytest.mark.parametrize(("text", "value"), [("40", 40), ("-1", -1), ("+3", 3), ("007", 7)])
def test_whole_numbers_in_ascii_digits_are_read(text, value):
    assert config_values.integer(text) == value


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_a_number_is_a_decimal_one_in_ascii_digits_only(text):
    with pytest.raises(ValueError, match="expected a number"):
        config_values.number(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("0.05", 0.05), (".5", 0.5), ("5.", 5.0), ("-1", -1.0), ("5e-2", 0.05), ("1E3", 1000.0),
     ("+2", 2.0)],
)  # fmt: skip
def test_decimal_numbers_in_ascii_digits_are_read(text, value):
    assert config_values.number(text) == value


@pytest.mark.parametrize(
    ("settings_", "complaint"),
    [
        ({"faults": arabic("gpu-hang@40")}, "FRAME, FRAMES: at most 18 ASCII digits"),
        ({"faults": "gpu-hang@40+" + arabic("2")}, "ASCII digits"),
        ({"faults": "gpu-hang@4_0"}, "ASCII digits"),
        ({"faults": "gpu-hang@" + "9" * 19}, "at most 18"),
        ({"calib": arabic("0") + ",0,0"}, "expected R,P,Y"),
        ({"calib": "0, 0, 0"}, "expected R,P,Y"),
        ({"calib": "nan,0,0"}, "expected R,P,Y"),
        ({"model_cpus": arabic("1")}, "CPU numbers"),
        ({"model_cpus": " 1"}, "CPU numbers"),
        ({"model_cpus": "1,"}, "CPU numbers"),
        ({"health_port": arabic("9032")}, "expected a whole number"),
        ({"frames": "1_000"}, "expected a whole number"),
        ({"budget": "0.0_5"}, "expected a number"),
        ({"duration": "inf"}, "expected a number"),
        ({"frames": "9" * 5000}, "at most 4300 digits"),
    ],
)
def test_every_text_form_reads_ascii_digits_only(settings_, complaint):
    with pytest.raises(ValueError, match=complaint):
        ServiceConfig(**settings_)


def test_ascii_text_forms_still_read_as_before():
    config = ServiceConfig(
        faults="gpu-hang@40+20, camera-stall@100", calib="-0.1,0.05,0", model_cpus="0,1",
        health_port="9032", frames="40", budget="5e-2",
    )  # fmt: skip
    assert config.faults == (FaultSpec("gpu-hang", 40, 20), FaultSpec("camera-stall", 100))
    assert config.calib == (-0.1, 0.05, 0.0) and config.model_cpus == (0, 1)
    assert (config.health_port, config.frames, config.budget) == (9032, 40, 0.05)


def test_an_echoed_value_is_cut_to_a_short_prefix_with_its_length():
    assert config_values.shown("gpu-melt@3") == "'gpu-melt@3'"
    long = "x" * 100_000
    assert config_values.shown(long) == "'" + "x" * 59 + "… (100000 characters)"
    assert len(config_values.shown(list(range(100)))) < 100


@pytest.mark.parametrize("name", [item.name for item, _ in settings()])
@pytest.mark.parametrize("long", ["x" * 100_000, ["x" * 100_000]], ids=["text", "list"])
def test_every_setting_echoes_a_100_kb_value_cut_short(name, long):
    """Every setting's refusal is made in one place, which cuts what it echoes: given 100 kB (as
    text, or in a list), a setting refuses it in one short line, or takes it (a path, checked
    against the machine later)."""
    try:
        ServiceConfig(**{name: long})
    except ValueError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 300, message[:300]
    else:
        assert isinstance(long, str)

"""The service's configuration: every setting declared once — its default, its check, its text
form and its command-line flag.

:class:`ServiceConfig` is plain data. Making one checks each value on its own and against the
others, and nothing else: no file is opened, the machine is not asked. What depends on the machine
(the camera file exists, the model's CPUs are CPUs this process may use) is checked by
:meth:`ServiceConfig.check_environment`, which the service calls as it starts and ``aio-dms run``
calls before it starts anything. A setting with a text form (the camera, the faults, the
calibration, the model's CPUs) may be given as that text: it is parsed once, as the config is made.
``aio-dms run``'s options are generated from the same declarations
(:mod:`pipelines.dms.run`), so each setting is settable there and ``--help`` shows its default.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .faults import FAULT_NAMES, FaultSpec, parse_faults

__all__ = [
    "CameraFile",
    "CameraSpec",
    "DeviceKind",
    "ServiceConfig",
    "Setting",
    "Synthetic",
    "parse_camera",
    "setting",
    "settings",
]


class DeviceKind(enum.StrEnum):
    """Where the model runs."""

    SIM = "sim"
    """The simulated accelerator: a GPU behind a USB-PCIe bridge, through ``transports``."""
    CPU = "cpu"
    """onnxruntime on the CPU."""


@dataclass(frozen=True)
class Synthetic:
    """The synthetic cabin camera."""

    def __str__(self) -> str:
        return "synthetic"


@dataclass(frozen=True)
class CameraFile:
    """A video file or a recording of ours (replayed); which of the two, its first bytes say
    when it is opened."""

    path: Path

    def __str__(self) -> str:
        return str(self.path)


CameraSpec = Synthetic | CameraFile


def parse_camera(text: str) -> CameraSpec:
    """``synthetic``, or the path of a video file or a recording."""
    if not text:
        raise ValueError("camera: expected 'synthetic', a video file or a recording, got ''")
    return Synthetic() if text == "synthetic" else CameraFile(Path(text))


Calibration = tuple[float, float, float]
"""(roll, pitch, yaw), radians."""


def _check_calibration(values: Any) -> Calibration:
    """Three finite numbers (roll, pitch, yaw), or :class:`ValueError` saying so."""
    try:
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        flat = np.zeros(0)
    if flat.size != 3 or not np.isfinite(flat).all():
        raise ValueError(f"calibration must be 3 finite numbers (roll, pitch, yaw), got {values!r}")
    return float(flat[0]), float(flat[1]), float(flat[2])


def _calibration(text: str) -> Calibration:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 3:
        raise ValueError(f"calib {text!r}: expected R,P,Y (three numbers)")
    return _check_calibration(values)


ModelCpus = tuple[int, ...] | Literal["auto"] | None


def _model_cpus(text: str) -> ModelCpus:
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        return tuple(int(cpu) for cpu in text.split(","))
    except ValueError:
        raise ValueError(f"model_cpus: expected auto, none or CPU numbers, got {text!r}") from None


def _port(text: str) -> int | None:
    port = int(text)
    return None if port < 0 else port  # the command line's "none"


def _port_number(value: Any) -> str | None:
    ok = value is None or (isinstance(value, int) and 0 <= value <= 65535)
    return None if ok else "must be a port number (0 to 65535, 0: any free port) or None"


def _device(text: str) -> DeviceKind:
    try:
        return DeviceKind(text)
    except ValueError:
        known = " or ".join(repr(kind.value) for kind in DeviceKind)
        raise ValueError(f"device must be {known}, got {text!r}") from None


# --- declarations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """How one :class:`ServiceConfig` field is set and checked."""

    help: str
    parse: Callable[[str], Any] | None = None
    """The setting's text form (the command line's, or text given to :class:`ServiceConfig`)."""
    check: Callable[[Any], str | None] | None = None
    """What is wrong with a value (None: nothing), as ``"must be ..."``."""
    flag: str | None = None
    """The command-line flag: ``--<field-name>`` unless given; ``""``: set through another's."""
    metavar: str | tuple[str, ...] | None = None
    shown: str | None = None
    """How ``--help`` shows the default (otherwise the default itself)."""
    command_line_default: str | None = None
    """The command line's default, as text, where it differs from the API's."""
    choices: tuple[str, ...] | None = None
    together: tuple[str, ...] = ()
    """Fields set by this one flag, in order (``--backoff FIRST MAX``)."""

    def accept(self, name: str, value: Any) -> Any:
        """``value`` for the setting ``name``: parsed if given as text, then checked;
        :class:`ValueError` saying what was expected."""
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if self.parse is not None and isinstance(value, str):
            try:
                value = self.parse(value)
            except ValueError as exc:
                said = str(exc)
                raise ValueError(said if said.startswith(name) else f"{name}: {said}") from None
        problem = None if self.check is None else self.check(value)
        if problem is not None:
            raise ValueError(f"{name} {problem}, got {value!r}")
        return value


def setting(default: Any, help: str, **how: Any) -> Any:
    """A :class:`ServiceConfig` field: its default and its :class:`Setting`."""
    return field(default=default, metadata={"setting": Setting(help, **how)})


def _within(low: float, high: float, unit: str = "seconds") -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, (int, float)) and low < value <= high
        return None if ok else f"must be in ({low:g}, {high:g}] {unit}"

    return check


def _positive(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    return None if ok else "must be a finite number of seconds > 0"


def _at_least_one(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return None if ok else "must be at least 1 frame"


@dataclass
class ServiceConfig:
    """Every setting of the service, with its default."""

    camera: CameraSpec = setting(
        Synthetic(),
        "synthetic, a video file, or a recording (replayed)",
        parse=parse_camera,
        metavar="synthetic|PATH",
    )
    model: Path | None = setting(
        None,
        "an ONNX model with openpilot's DMS contract",
        parse=Path,
        metavar="PATH",
        shown="the bundled, untrained reference model",
    )
    device: DeviceKind = setting(
        DeviceKind.SIM,
        "sim: the model on the simulated accelerator; cpu: onnxruntime on the CPU",
        parse=_device,
        check=lambda value: None if value in tuple(DeviceKind) else "must be 'sim' or 'cpu'",
        choices=tuple(kind.value for kind in DeviceKind),
    )
    budget: float = setting(
        0.050,
        "seconds from start of frame to publication (one frame period at 20 Hz)",
        parse=float,
        check=_within(0, 10),
    )
    recover_after: int = setting(
        3, "good frames in a row before the service is available again", parse=int,
        check=_at_least_one,
    )  # fmt: skip
    unavailable_after: int = setting(
        10,
        "frames in a row without a valid output (each only degraded) before the service is "
        "unavailable: degraded is for isolated failures",
        parse=int,
        check=_at_least_one,
    )
    gpu_hang_after: float = setting(
        0.1,
        "seconds the accelerator may hold a kernel without completing it before it counts as "
        "hung (unavailable, restarted); also the bound of its kernel waits. A frame that runs "
        "out of budget while the accelerator still makes progress is late (degraded)",
        parse=float,
        check=_within(0, 60),
    )
    backoff_initial: float = setting(
        0.1,
        "accelerator restart backoff: the first delay, doubling up to the cap, seconds",
        parse=float,
        check=_positive,
        flag="--backoff",
        metavar=("FIRST", "MAX"),
        together=("backoff_initial", "backoff_max"),
    )
    backoff_max: float = setting(5.0, "", parse=float, check=_positive, flag="")
    calib: Calibration | None = setting(
        None,
        "a static calibration (roll, pitch, yaw)",
        parse=_calibration,
        metavar="R,P,Y",
        shown="the synthetic calibration stream",
    )
    calib_stale_after: float = setting(
        2.5,
        "seconds after which calibration is stale (openpilot's rule for a 4 Hz stream)",
        parse=float,
    )
    camera_stall_after: float = setting(
        0.25, "seconds without a frame before the camera counts as stalled", parse=float
    )
    health_host: str = setting(
        "127.0.0.1", "the address of the health and metrics endpoints", metavar="HOST"
    )
    health_port: int | None = setting(
        9032,
        "the port of the health and metrics endpoints (0: any free port; -1: none)",
        parse=_port,
        check=_port_number,
        metavar="PORT",
    )
    zmq: str | None = setting(
        None,
        "publish on ZeroMQ PUB (loopback), e.g. tcp://127.0.0.1:9031",
        metavar="ADDRESS",
        shown="off",
    )
    jsonl: str | None = setting(
        None, "write messages as JSON lines to PATH (-: standard output)", metavar="PATH|-",
        shown="off",
    )  # fmt: skip
    raw_predictions: bool = setting(
        False, "include the model's raw output (rawPredictions)", shown="off"
    )
    frames: int | None = setting(None, "stop after N frames", parse=int, shown="no limit")
    duration: float | None = setting(None, "stop after S seconds", parse=float, shown="no limit")
    faults: tuple[FaultSpec, ...] = setting(
        (),
        "scripted faults, comma-separated NAME@FRAME[+FRAMES], e.g. gpu-hang@40+20; names: "
        + ", ".join(FAULT_NAMES),
        parse=lambda text: tuple(parse_faults(text)),
        metavar="SPEC",
        shown="none",
    )
    intra_op_threads: int = setting(1, "onnxruntime intra-op threads", parse=int, flag="--threads")
    model_cpus: ModelCpus = setting(
        None,
        "CPUs for the model's thread (onnxruntime on the CPU), the event loop and the warp kept "
        "off them: a run woken by the loop is otherwise often placed on the loop's own CPU and "
        "holds it off for milliseconds (Linux only). auto: the last CPU with --device cpu, when "
        "there are two or more",
        parse=_model_cpus,
        metavar="auto|none|N,N...",
        shown="none",
        command_line_default="auto",
    )
    model_load_timeout: float = setting(
        10.0, "seconds to load the model (its contract, its session)", parse=float,
        check=_positive,
    )  # fmt: skip
    device_open_timeout: float = setting(
        10.0, "seconds to open (boot) an accelerator session", parse=float, check=_positive
    )
    fence_timeout: float = setting(
        1.0, "seconds the accelerator's copy engine may take to take a chunk", parse=float,
        check=_positive,
    )  # fmt: skip
    bulk_timeout: float = setting(
        1.0, "seconds a USB bulk transfer to the accelerator may take", parse=float,
        check=_positive,
    )  # fmt: skip
    warp_plan_timeout: float = setting(
        10.0, "seconds to plan the cabin cameras' warps as the service starts", parse=float,
        check=_positive,
    )  # fmt: skip
    healthy_after: float = setting(
        1.0,
        "seconds an accelerator session must stay up for its failure to restart the backoff "
        "from its first delay",
        parse=float,
        check=_positive,
    )

    def __post_init__(self) -> None:
        for item, declared in settings():
            setattr(self, item.name, declared.accept(item.name, getattr(self, item.name)))
        if self.calib is not None:
            self.calib = _check_calibration(self.calib)
        if self.backoff_max < self.backoff_initial:
            raise ValueError(
                f"backoff_max must be at least backoff_initial ({self.backoff_initial}), "
                f"got {self.backoff_max}"
            )
        if self.device is DeviceKind.CPU and any(spec.device is not None for spec in self.faults):
            raise ValueError("accelerator faults need --device sim")

    def check_environment(self) -> None:
        """What depends on the machine: the camera file exists; the model's CPUs are CPUs this
        process may use, with one left for the event loop. :class:`ValueError` saying what was
        expected."""
        if isinstance(self.camera, CameraFile) and not self.camera.path.is_file():
            raise ValueError(
                f"camera {str(self.camera)!r}: no such file (expected 'synthetic', a video file "
                "or a recording)"
            )
        self.placed_cpus()

    def placed_cpus(self) -> frozenset[int] | None:
        """The CPUs of the CPU runner's thread on this machine (``auto`` resolved); None for no
        placement, which is also the answer for any other device. CPUs named are checked
        whatever the device: :class:`ValueError` for CPUs there are not."""
        cpus = self.model_cpus
        if cpus is None:
            return None
        if not hasattr(os, "sched_getaffinity"):
            if cpus == "auto":
                return None  # placement is Linux's; auto stands down elsewhere
            raise ValueError("model_cpus needs CPU placement, which only Linux offers here")
        available = os.sched_getaffinity(0)
        if cpus != "auto":
            if not cpus or not set(cpus) <= available:
                raise ValueError(
                    f"model_cpus must be some of the CPUs this process may use "
                    f"({sorted(available)}), got {list(cpus)}"
                )
            if not available - set(cpus):
                raise ValueError(f"model_cpus {list(cpus)} leaves no CPU for the event loop")
        if self.device is not DeviceKind.CPU:
            return None  # the CPUs are for the CPU runner's thread: elsewhere none are placed
        if cpus == "auto":
            return frozenset({max(available)}) if len(available) >= 2 else None
        return frozenset(cpus)


def settings() -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Every field of :class:`ServiceConfig` with its declaration, in order."""
    for item in dataclasses.fields(ServiceConfig):
        yield item, item.metadata["setting"]

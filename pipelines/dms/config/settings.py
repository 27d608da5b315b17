"""The service's configuration: every setting declared once — its default, its check, its text
form and its command-line flag.

:class:`ServiceConfig` is plain data. Making one checks each value on its own and against the
others, and nothing else: no file is opened, the machine is not asked. What depends on the machine
(the camera file exists, the model's CPUs are CPUs this process may use) is checked by
:meth:`ServiceConfig.check_environment`, which the service calls as it starts and ``aio-dms run``
calls before it starts anything. A setting with a text form (the camera, the faults, the
calibration, the model's CPUs) may be given as that text: it is parsed once, as the config is made.
``aio-dms run``'s options are generated from the same declarations
(:mod:`pipelines.cli.run`), so each setting is settable there and ``--help`` shows its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import machine, values
from .faults import FAULT_NAMES, FaultSpec, faults_value, parse_faults
from .kinds import CameraFile, CameraSpec, DeviceKind, Mode, Synthetic, camera_value, parse_camera
from .text import Calibration, ModelCpus
from .values import Setting, is_loopback, setting

__all__ = [
    "STALE_AFTER",
    "CameraFile",
    "CameraSpec",
    "DeviceKind",
    "Mode",
    "ServiceConfig",
    "Setting",
    "Synthetic",
    "parse_camera",
    "setting",
    "settings",
]


# --- declarations ----------------------------------------------------------------------------

STALE_AFTER = 0.100
"""The staleness bound by default: two frame periods at 20 Hz."""


@dataclass
class ServiceConfig:
    """Every setting of the service, with its default."""

    camera: CameraSpec = setting(
        Synthetic(),
        "synthetic, a video file, a recording (replayed), or an openpilot route segment "
        "directory (its dcamera.hevc, timed by its rlog)",
        parse=parse_camera,
        check=camera_value,
        metavar="synthetic|PATH",
        commands=("run",),
    )
    model: Path | None = setting(
        None,
        "an ONNX model with openpilot's DMS contract",
        parse=Path,
        check=values.optional(values.path_value),
        metavar="PATH",
        shown="the bundled, untrained reference model",
    )
    device: DeviceKind = setting(
        DeviceKind.SIM,
        "sim: the model on the simulated accelerator; cpu: onnxruntime on the CPU",
        parse=values.choice(DeviceKind),
        check=values.member(DeviceKind),
        choices=tuple(kind.value for kind in DeviceKind),
    )
    budget: float = setting(
        0.050,
        "seconds from start of frame to the frame's deadline (one frame period at 20 Hz): a valid "
        "output published after it is valid and flagged late",
        parse=values.number,
        check=values.within(0, 10),
    )
    stale_after: float | None = setting(
        None, "seconds from start of frame after which an output is of no use: every wait for "
        "the frame ends there, and a frame older than this is invalid (stale); at least the "
        "budget", parse=values.number, check=values.optional(values.within(0, 10)),
        shown=f"{STALE_AFTER:g} s (two frame periods at 20 Hz), or the budget if that is longer",
    )  # fmt: skip
    min_rate: float | None = setting(
        None, "valid frames per second below which a service that cannot keep up is unavailable "
        "(overloaded); above it, fewer frames than the camera's are degraded",
        parse=values.number, check=values.optional(values.within(0, 1000, "frames per second")),
        metavar="HZ", shown="0.8 x the camera's rate: 16 Hz at 20 Hz, what openpilot needs",
    )  # fmt: skip
    recover_after: int = setting(
        3, "good frames in a row before the service is available again", parse=values.integer,
        check=values.at_least_one,
    )  # fmt: skip
    unavailable_after: int = setting(
        10,
        "frames in a row without a valid output (each only degraded) before the service is "
        "unavailable: degraded is for isolated failures",
        parse=values.integer,
        check=values.at_least_one,
    )
    gpu_hang_after: float = setting(
        0.1,
        "seconds the accelerator may be seen to make no progress on a run before it counts as "
        "hung (unavailable, restarted); time this host could not run (its event loop late, its "
        "worker threads waiting for a CPU) is no evidence: a starved host is overloaded, not a "
        "hung device",
        parse=values.number,
        check=values.within(0, 60),
    )
    backoff_initial: float = setting(
        0.1,
        "accelerator restart backoff: the first delay, doubling up to the cap, seconds; each at "
        f"most {values.BACKOFF_LIMIT:g}, as the service retries at the cap: a longer one would "
        "keep it unavailable long after its device is back",
        parse=values.number,
        check=values.within(0, values.BACKOFF_LIMIT),
        flag="--backoff",
        metavar=("FIRST", "MAX"),
        together=("backoff_initial", "backoff_max"),
    )
    backoff_max: float = setting(
        5.0, "", parse=values.number, check=values.within(0, values.BACKOFF_LIMIT), flag="")  # fmt: skip
    calib: Calibration | None = setting(
        None,
        "a static calibration (roll, pitch, yaw)",
        parse=values.calibration,
        metavar="R,P,Y",
        shown="the synthetic calibration stream",
    )
    calib_stale_after: float = setting(
        2.5,
        "seconds after which calibration is stale (openpilot's rule for a 4 Hz stream)",
        parse=values.number,
        check=values.positive,
    )
    camera_stall_after: float = setting(
        0.25,
        "seconds without a frame before the camera counts as stalled",
        parse=values.number,
        check=values.positive,
    )
    health_host: str = setting(
        "127.0.0.1",
        "the address of the health and metrics endpoints (loopback unless --allow-remote)",
        check=values.host_value,
        metavar="HOST",
    )
    health_port: int | None = setting(
        9032,
        "the port of the health and metrics endpoints (0: any free port; -1: none)",
        parse=values.port,
        check=values.port_number,
        metavar="PORT",
    )
    zmq: str | None = setting(
        None,
        "publish on ZeroMQ PUB, e.g. tcp://127.0.0.1:9031 (loopback unless --allow-remote)",
        check=values.zmq_value,
        metavar="ADDRESS",
        shown="off",
    )
    jsonl: str | None = setting(
        None,
        "write messages as JSON lines to PATH (-: standard output); a file that exists is "
        "refused unless --append",
        metavar="PATH|-",
        check=values.optional(values.text_value),
        shown="off",
    )
    jsonl_append: bool = setting(
        False,
        "append to the --jsonl file if it exists (each line's runId tells the runs apart)",
        check=values.flag_value,
        flag="--append",
        shown="off",
    )
    rlog: Path | None = setting(
        None,
        "write every message as openpilot's log Events to PATH, a new file: zstd if it ends in "
        ".zst (a block flushed at every write: a killed run leaves a readable log), bz2 if .bz2 "
        "(readable once the run has ended), plain with no extension (name it rlog)",
        parse=values.log_path,
        check=values.optional(values.log_path_value),
        metavar="PATH",
        shown="off",
    )
    parquet: Path | None = setting(
        None,
        "write one row per frame to PATH, a new Parquet file, when the replay has ended by "
        "itself (the rows are in .NAME.partial beside it until then, and stay there if it does "
        "not); needs pyarrow (the fleet extra)",
        parse=values.new_file_path,
        check=values.optional(values.file_path_value),
        metavar="PATH",
        shown="off",
        commands=("replay",),
    )
    csv: Path | None = setting(
        None,
        "write one row per frame to PATH, a new CSV file: the Parquet columns, as text",
        parse=values.new_file_path,
        check=values.optional(values.file_path_value),
        metavar="PATH",
        shown="off",
    )
    cereal_zmq: str | None = setting(
        None,
        "publish openpilot's Events on cereal's ZeroMQ ports on HOST (127.0.0.1 if not given; "
        "loopback unless --allow-remote): driverStateV2 on 45495, dmsStatus on 53156",
        check=values.optional(values.host_value),
        metavar="HOST",
        shown="off",
        bare="127.0.0.1",
    )
    run_id: str | None = setting(
        None,
        "the runId every message carries (letters, digits and . _ : -, at most 64)",
        check=values.optional(values.run_id_value),
        metavar="ID",
        shown="a fresh one per start, UTC time and a random suffix",
    )
    mode: Mode = setting(
        Mode.LIVE,
        "live: a camera, paced; replay: a file, as fast as the stages go, nothing lost",
        parse=values.choice(Mode),
        check=values.member(Mode),
        commands=(),
    )
    no_budget: bool = setting(
        False,
        "no frame budget: every frame waits for its output however long it takes (bounded by "
        "the hardware's own bounds), so a replay's outputs do not depend on the machine's speed",
        check=values.flag_value,
        shown="off",
        commands=("replay",),
    )
    allow_remote: bool = setting(
        False,
        "let the health endpoints and ZeroMQ (--zmq, --cereal-zmq) listen on addresses beyond "
        "this machine",
        check=values.flag_value,
        shown="off",
    )
    raw_predictions: bool = setting(
        False,
        "include the model's raw output (rawPredictions)",
        check=values.flag_value,
        shown="off",
    )
    frames: int | None = setting(
        None,
        "stop after N frames",
        parse=values.integer,
        check=values.optional(values.at_least_one),
        shown="no limit",
    )
    duration: float | None = setting(
        None,
        "stop after S seconds of taking frames",
        parse=values.number,
        check=values.optional(values.positive),
        shown="no limit",
    )
    faults: tuple[FaultSpec, ...] = setting(
        (),
        "scripted faults, comma-separated NAME@FRAME[+FRAMES], e.g. gpu-hang@40+20; names: "
        + ", ".join(FAULT_NAMES),
        parse=lambda text: tuple(parse_faults(text)),
        check=faults_value,
        metavar="SPEC",
        shown="none",
    )
    intra_op_threads: int = setting(
        1,
        "onnxruntime intra-op threads",
        parse=values.integer,
        check=values.threads_value,
        flag="--threads",
    )
    model_cpus: ModelCpus = setting(
        None,
        "CPUs for the model's thread (onnxruntime on the CPU), the event loop and the warp kept "
        "off them: a run woken by the loop is otherwise often placed on the loop's own CPU and "
        "holds it off for milliseconds (Linux only). auto: the last CPU with --device cpu, when "
        "there are two or more",
        parse=values.model_cpus,
        check=values.model_cpus_value,
        metavar="auto|none|N,N...",
        shown="none",
        command_line_default="auto",
    )
    realtime: int | None = setting(
        None, "run the service's threads (the event loop's, the warp's, the model's, the "
        "simulated GPU's, the camera's) at this real-time priority (SCHED_FIFO, 1-99), as "
        "openpilot's dmonitoringmodeld does on a shared computer (their CPUs: --model-cpus); "
        "needs the privilege to", parse=machine.realtime,
        check=machine.realtime_value, metavar="PRIORITY", shown="off",
    )  # fmt: skip
    model_load_timeout: float = setting(
        10.0, "seconds to load the model (its contract, its session)", parse=values.number,
        check=values.positive,
    )  # fmt: skip
    device_open_timeout: float = setting(
        10.0,
        "seconds to open (boot) an accelerator session",
        parse=values.number,
        check=values.positive,
    )
    fence_timeout: float = setting(
        1.0, "seconds the accelerator's copy engine may take to take a chunk", parse=values.number,
        check=values.positive,
    )  # fmt: skip
    bulk_timeout: float = setting(
        1.0, "seconds a USB bulk transfer to the accelerator may take", parse=values.number,
        check=values.positive,
    )  # fmt: skip
    warp_plan_timeout: float = setting(
        10.0, "seconds to plan the cabin cameras' warps as the service starts", parse=values.number,
        check=values.positive,
    )  # fmt: skip
    healthy_after: float = setting(
        1.0,
        "seconds an accelerator session must stay up for its failure to restart the backoff "
        "from its first delay",
        parse=values.number,
        check=values.positive,
    )

    def __post_init__(self) -> None:
        if isinstance(self.faults, list):
            self.faults = tuple(self.faults)
        for item, declared in settings():
            setattr(self, item.name, declared.accept(item.name, getattr(self, item.name)))
        for name in ("health_host", "cereal_zmq"):
            host = getattr(self, name)
            if host is not None and not self.allow_remote and not is_loopback(host):
                raise ValueError(
                    f"{name} {host!r} is not a loopback address: refused unless allow_remote "
                    "(--allow-remote) is set"
                )
        if self.zmq is not None:
            values.check_zmq_address(self.zmq, allow_remote=self.allow_remote)
        if self.calib is not None:
            self.calib = values.check_calibration(self.calib)
        if self.stale_after is not None and self.stale_after < self.budget:
            raise ValueError(
                f"stale_after must be at least the budget ({self.budget:g} s), "
                f"got {self.stale_after:g}"
            )
        if self.backoff_max < self.backoff_initial:
            raise ValueError(
                f"backoff_max must be at least backoff_initial ({self.backoff_initial}), "
                f"got {self.backoff_max}"
            )
        if self.jsonl_append and self.jsonl in (None, "-"):
            raise ValueError("jsonl_append (--append) is for a JSON lines file (--jsonl PATH)")
        for name in ("no_budget", "parquet"):
            if getattr(self, name) not in (None, False) and self.mode is not Mode.REPLAY:
                raise ValueError(f"{name} is for replays (mode 'replay', aio-dms replay)")
        if self.device is DeviceKind.CPU and any(spec.device is not None for spec in self.faults):
            raise ValueError("accelerator faults need --device sim")

    @property
    def staleness(self) -> float:
        """Seconds from start of frame to a frame's staleness bound: ``stale_after``, or by
        default :data:`STALE_AFTER` or the budget, whichever is longer."""
        return max(STALE_AFTER, self.budget) if self.stale_after is None else self.stale_after

    def check_environment(self) -> None:
        """What depends on the machine (:func:`pipelines.dms.config.machine.check_environment`):
        :class:`ValueError` saying what was expected. (A port in use is found as the service
        binds it.)"""
        machine.check_environment(self)

    def placed_cpus(self) -> frozenset[int] | None:
        """The CPUs of the CPU runner's thread on this machine (``auto`` resolved); None for no
        placement, which is also the answer for any other device. CPUs named are checked
        whatever the device: :class:`ValueError` for CPUs there are not."""
        return machine.placed_cpus(self.model_cpus, cpu_device=self.device is DeviceKind.CPU)


def settings() -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Every field of :class:`ServiceConfig` with its declaration, in order."""
    for item in dataclasses.fields(ServiceConfig):
        yield item, item.metadata["setting"]

"""What a service's configuration asks of the machine it runs on, checked as the service starts
(and by ``aio-dms run`` before it starts anything): its files, the CPUs it places the model's
thread on, and the real-time priority it takes for its threads — as openpilot's
``dmonitoringmodeld`` takes one on a shared computer (``config_realtime_process``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from aio_runtime import can_run_realtime

from . import values
from .kinds import CameraFile
from .text import ModelCpus

if TYPE_CHECKING:
    from .settings import ServiceConfig

__all__ = [
    "REALTIME_PRIORITIES",
    "check_environment",
    "check_realtime",
    "placed_cpus",
    "realtime",
    "realtime_value",
]

REALTIME_PRIORITIES = (1, 99)
"""The real-time (``SCHED_FIFO``) priorities Linux has, lowest first."""


def check_environment(config: ServiceConfig) -> None:
    """The camera and model files exist and can be read (a camera directory holds a route
    segment's video and log); the model's CPUs are CPUs this process may use, with one left for
    the event loop; the real-time priority is one it may take. :class:`ValueError` saying what
    was expected. The files the sinks write are their own kinds' to check
    (:meth:`pipelines.dms.sinks.SinkKind.check_environment`), as the service starts."""
    if isinstance(config.camera, CameraFile):
        config.camera.check_environment()
    if config.model is not None:
        values.readable_file("model", config.model, "expected an ONNX model file")
    config.placed_cpus()
    check_realtime(config.realtime)


def placed_cpus(cpus: ModelCpus, *, cpu_device: bool) -> frozenset[int] | None:
    """The CPUs ``model_cpus`` names on this machine (``auto``: the last CPU, where there are two
    or more), for the CPU runner's thread (``cpu_device``; None for any other device, and for
    no placement). CPUs named are checked whatever the device: :class:`ValueError` for CPUs
    there are not, or that leave none for the event loop."""
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
    if not cpu_device:
        return None  # the CPUs are for the CPU runner's thread: elsewhere none are placed
    if cpus == "auto":
        return frozenset({max(available)}) if len(available) >= 2 else None
    return frozenset(cpus)


def realtime(text: str) -> int | None:
    """``none``, or a real-time priority."""
    return None if text == "none" else values.integer(text)


def realtime_value(value: Any) -> str | None:
    low, high = REALTIME_PRIORITIES
    ok = value is None or (values.is_int(value) and low <= value <= high)
    return None if ok else f"must be a real-time priority from {low} to {high}, or None"


def check_realtime(priority: int | None) -> None:
    """That this process may run threads at ``priority`` (a thread tries, then ends):
    :class:`ValueError` saying what it needs where it may not."""
    if priority is None:
        return
    if not hasattr(os, "SCHED_FIFO"):
        raise ValueError("realtime needs real-time scheduling (SCHED_FIFO), which only Linux has")
    refused = can_run_realtime(priority)
    if refused is not None:
        raise ValueError(
            f"realtime {priority}: this process may not run threads at a real-time priority "
            f"({refused.strerror}): it needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least "
            f"{priority}, and real-time time in its control group"
        )

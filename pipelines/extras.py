"""The optional parts of the installation: what each installs, how to tell whether it is there,
and what to type to install it. The commands that need one name it, in one line, when it is
missing (:data:`pipelines.cli.COMMANDS`)."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

__all__ = ["DMS", "DMS_EXTRA", "FLEET", "FLEET_EXTRA", "REPORT", "VIDEO", "Extra"]

_OWN_PACKAGES = ("aio_runtime", "transports", "pipelines")


@dataclass(frozen=True)
class Extra:
    """An extra of the distribution, ``pip install 'aio-dms[NAME]'``."""

    name: str
    needed_by: str
    """What needs it, as a refusal says it: ``the DMS service needs``."""
    imports: tuple[str, ...] = ()
    """Modules imported to tell whether it is installed: what the commands that need it import,
    so that a module missing anywhere below them is found."""
    finds: tuple[str, ...] = ()
    """Modules found, not imported, to tell (where importing costs: Ray)."""

    @property
    def install(self) -> str:
        """What installs it."""
        return f"pip install 'aio-dms[{self.name}]'"

    def missing(self) -> str | None:
        """The top-level module of what the extra installs that is not there, or None. A module
        of this project's own that does not import is a broken installation, not a missing extra:
        that error propagates."""
        for module in self.finds:
            if not _found(module):
                return module
        try:
            for module in self.imports:
                importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if not missing or missing in _OWN_PACKAGES:
                raise
            return missing  # what a distribution installs: ``hypercorn`` for ``hypercorn.config``
        return None

    def lacking(self, missing: str) -> str:
        """What is wrong, and what to type, when ``missing`` is not installed."""
        return (
            f"{self.needed_by} the {self.name} extra, which is not installed (no module named "
            f"{missing!r}): {self.install}"
        )

    def refusal(self, command: str, missing: str) -> str:
        """The line that refuses ``command`` because ``missing`` is not installed."""
        return f"aio-dms {command}: {self.lacking(missing)}"


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # blocked (None in sys.modules)
        return False


DMS = Extra(
    "dms",
    "the DMS service needs",
    imports=(
        "pipelines.cli.run",
        "pipelines.dms.model.contract",
        "pipelines.dms.model.reference",
        "pipelines.dms.sinks.zmq",  # the ZeroMQ kinds, opened only when a setting asks for one
        "hypercorn.config",  # imported by the health server as it starts
    ),
)
REPORT = Extra("report", "the report's plots need", finds=("matplotlib",))
"""The report's plots (matplotlib)."""
VIDEO = Extra("video", "video files and route segments need", finds=("av",))
"""Video decoding (PyAV: FFmpeg's decoders), for a camera that is a video file or a segment."""
FLEET = Extra("fleet", "fleet replays need", finds=("pyarrow", "ray"))

DMS_EXTRA = DMS.install
"""What installs the DMS service's dependencies."""
FLEET_EXTRA = FLEET.install
"""What installs pyarrow (Parquet) and Ray (fleet replays)."""

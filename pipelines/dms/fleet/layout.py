"""A fleet run's directory (``--out``): where each output is, and what resuming one checks.

::

    OUT/fleet.json                         the run: its settings, its state, every recording's
                                           summary and the fleet's (written at the start, and
                                           again as it ends, however it ends)
    OUT/recordings.parquet                 one row per recording: its summary (as it ends)
    OUT/frames/<recording>/part-0.parquet  one row per frame (:mod:`~..sinks.parquet`); the
                                           directory is the recording's name, quoted
                                           (:func:`recording_directory`); the file is
                                           there only once the recording was replayed whole
    OUT/baseline/                          with ``--baseline-model``: the baseline model's run,
                                           laid out the same
    OUT/comparison/                        with ``--baseline-model``: the two models compared

A recording is *done* once its frames file is there (a replay interrupted or failed leaves, at
most, a hidden ``.part-0.parquet.partial`` beside it, which the next attempt replaces). Resuming
(an ``OUT`` that holds a ``fleet.json``) skips the recordings done; it is refused when the run
there was made with other settings (the model, its file's contents, the device...), which would
mix two models' rows in one dataset.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import urllib.parse
from pathlib import Path
from typing import Any

from ..config.settings import ServiceConfig
from ..model.reference import reference_model_path
from ..sinks import SINKS
from ..summary import write_json_document
from .run_frames import FRAMES_DIR

__all__ = [
    "FIXED",
    "FRAMES_FILE",
    "LAYOUT_VERSION",
    "OUTPUTS",
    "PER_RECORDING",
    "RunDirectory",
    "recording_directory",
    "replay_settings",
]

LAYOUT_VERSION = 1
"""The version of the layout and of ``fleet.json``; raised when either changes meaning."""
FRAMES_FILE = "part-0.parquet"
PER_RECORDING = frozenset({"camera", "parquet", "run_id", "mode", "health_port", "model_cpus"})
"""Settings the fleet sets for each replay itself."""
OUTPUTS = frozenset({"health_host", *(name for kind in SINKS for name in kind.settings)})
"""Settings of where messages go (the health endpoints and every kind of sink), which a fleet's
workers do not take: the dataset is the fleet's output."""
FIXED = OUTPUTS | PER_RECORDING | {"allow_remote", "raw_predictions", "duration", "no_budget"}
"""The replay's settings a fleet does not take from its command line: its outputs, and what the
fleet sets for each replay (no health endpoint, no CPUs placed, no frame budget unless
``--budget`` is given)."""


def replay_settings(config: ServiceConfig) -> dict[str, Any]:
    """What makes a replay's rows what they are: every setting but the ones the fleet sets for
    each replay and the outputs, as JSON values; the model as its file's SHA-256 too."""
    values: dict[str, Any] = {}
    for item in dataclasses.fields(config):
        if item.name in PER_RECORDING or item.name in OUTPUTS:
            continue
        value = getattr(config, item.name)
        if isinstance(value, enum.Enum):
            value = value.value
        values[item.name] = value if isinstance(value, bool | int | float | None) else str(value)
    model = config.model if config.model is not None else reference_model_path()
    values["modelSha256"] = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    return values


def recording_directory(recording: str) -> str:
    """The name of ``recording``'s directory: quoted (``urllib.parse.quote``, nothing kept),
    a leading ``.`` or ``_`` too (dataset readers pass over such names as hidden)."""
    quoted = urllib.parse.quote(recording, safe="")
    if quoted[:1] in (".", "_"):
        quoted = f"%{ord(quoted[0]):02X}{quoted[1:]}"
    return quoted


class RunDirectory:
    """The outputs of one fleet run (see the module's description)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def run_file(self) -> Path:
        return self.root / "fleet.json"

    @property
    def recordings_table(self) -> Path:
        return self.root / "recordings.parquet"

    @property
    def frames_dir(self) -> Path:
        return self.root / FRAMES_DIR

    @property
    def baseline(self) -> RunDirectory:
        return RunDirectory(self.root / "baseline")

    @property
    def comparison_dir(self) -> Path:
        return self.root / "comparison"

    def frames(self, recording: str) -> Path:
        """The frames file of ``recording``."""
        return self.frames_dir / recording_directory(recording) / FRAMES_FILE

    def done(self, recording: str) -> bool:
        """``recording`` was replayed whole (by this run, or by the one it resumes)."""
        return self.frames(recording).is_file()

    def check(self, settings: dict[str, Any]) -> bool:
        """Whether this directory holds a run to resume (True) or none yet (False);
        :class:`ValueError` in one line where it cannot be written to, is something else, or
        holds a run made with other ``settings``."""
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"--out {self.root}: expected a directory, got a file")
        if not self.run_file.exists():
            if self.root.is_dir() and any(self.root.iterdir()):
                raise ValueError(
                    f"--out {self.root}: the directory holds files but no fleet.json: "
                    "expected a fleet run's directory to resume, or a new or empty one"
                )
            return False
        try:
            earlier = json.loads(self.run_file.read_text(encoding="utf-8"))["settings"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--out {self.root}: its fleet.json cannot be read: {exc}") from None
        changed = sorted(
            name for name in settings.keys() | earlier.keys()
            if settings.get(name) != earlier.get(name)
        )  # fmt: skip
        if changed:
            raise ValueError(
                f"--out {self.root} was replayed with other settings ({', '.join(changed)}): "
                "resuming it would mix their rows; give another --out"
            )
        return True

    def write_run(self, document: dict[str, Any]) -> None:
        """Write ``fleet.json`` whole (:class:`OSError` if it cannot be)."""
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_document(self.run_file, document)

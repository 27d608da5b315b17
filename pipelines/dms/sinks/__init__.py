"""Where the messages go: the sink protocol, its counting and its errors (:mod:`.base`), several
sinks driven as one (:mod:`.publish`), and one module a kind: in-process subscriptions
(:mod:`.memory`, always there), files (:mod:`.file`: :mod:`.jsonl`, :mod:`.rlog`,
:mod:`.parquet`), ZeroMQ (:mod:`.zmq`, with :mod:`.zmq_gate`) and openpilot's cereal sockets
(:mod:`.cereal`).

Here, the table of the kinds a setting turns on (:data:`SINKS`): each row names the settings of
:class:`~pipelines.dms.config.settings.ServiceConfig` it reads (the first turns it on), its module
(imported only when the kind is used) and whether its setting names a file the run writes. A kind's
module gives ``open_sinks(config, rows) -> list[Sink]``. Everything that iterates the sinks — the
service checking their files and opening them, the run's list of files, the settings a fleet
does not take — reads this table; adding a sink is one module, one row and one setting.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from .base import Sink

__all__ = ["SINKS", "Rows", "SinkKind", "open_sinks"]


class Rows(NamedTuple):
    """What a replay's rows carry besides the messages: the recording's name, and how many rows a
    row group holds."""

    recording: str
    row_group: int


@dataclass(frozen=True)
class SinkKind:
    """A kind of sink that a setting turns on."""

    settings: tuple[str, ...]
    """Its own settings, the one that turns it on first (besides those it shares with other
    outputs: ``allow_remote``)."""
    module: str
    """Its module, relative to this package: it gives ``open_sinks(config, rows)``."""
    writes_file: bool = False
    """Its setting names a file the run writes (``-``: standard output, no file): a new file,
    checked as the service starts (:meth:`check_environment`)."""
    appended_by: str | None = None
    """The setting that lets the file be there already, to be appended to (None: it must be
    new)."""

    @property
    def setting(self) -> str:
        return self.settings[0]

    def is_on(self, config: ServiceConfig) -> bool:
        return getattr(config, self.setting) not in (None, False)

    def file(self, config: ServiceConfig) -> Path | None:
        """The file the run writes for it, if any."""
        value = getattr(config, self.setting)
        return Path(value) if self.writes_file and value not in (None, "-") else None

    def check_environment(self, config: ServiceConfig) -> None:
        """The file it writes, if any, can be written: a new file, or one there already where
        its ``appended_by`` setting is on. :class:`ValueError` saying what was expected."""
        from ..config import values

        path = self.file(config)
        if path is None:
            return
        if self.appended_by is None:
            values.new_file(self.setting, path)
            return
        values.writable_file(self.setting, path)
        if not getattr(config, self.appended_by) and path.is_file():
            raise ValueError(
                f"{self.setting} {str(path)!r} exists: refused unless {self.appended_by} "
                "(--append) is set"
            )

    def load(self) -> ModuleType:
        return importlib.import_module(self.module, __name__)


SINKS = (
    SinkKind(("zmq",), ".zmq"),
    SinkKind(("jsonl", "jsonl_append"), ".jsonl", writes_file=True, appended_by="jsonl_append"),
    SinkKind(("rlog",), ".rlog", writes_file=True),
    SinkKind(("parquet",), ".parquet", writes_file=True),
    SinkKind(("csv",), ".csv", writes_file=True),
    SinkKind(("cereal_zmq",), ".cereal"),
)
"""Every kind a setting turns on, in the order the service opens them."""


def open_sinks(kind: SinkKind, config: ServiceConfig, rows: Rows) -> list[Sink]:
    """The sinks of ``kind`` that ``config`` asks for, open (none if it asks for none);
    :class:`OSError` or :class:`ValueError` for one that cannot be opened."""
    if not kind.is_on(config):
        return []
    made: list[Sink] = kind.load().open_sinks(config, rows)
    return made

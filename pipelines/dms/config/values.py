"""How a setting of the service is declared (:class:`Setting`, :func:`setting`), and the checks
the settings use, with their text forms (:mod:`pipelines.dms.config.text`, re-exported here);
:mod:`pipelines.dms.config.settings` declares which setting uses which.

A check says what is wrong with a value (None: nothing) as ``"must be ..."``; it is pure. The
file checks (:func:`readable_file`, :func:`writable_file`) ask the machine, and are for
:meth:`~pipelines.dms.config.settings.ServiceConfig.check_environment` only. Every setting's refusal is
made in :meth:`Setting.accept`, the value refused echoed through :func:`shown`, cut to its first
:data:`ECHO_LIMIT` characters: a 100 kB value is not written back whole.
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ...echo import ECHO_LIMIT, shown, shown_path
from ..openpilot.logs import compression_of
from .text import (
    Calibration,
    ModelCpus,
    Unexpected,
    calibration,
    check_calibration,
    choice,
    integer,
    log_path,
    model_cpus,
    new_file_path,
    number,
    one_of,
    port,
)

E = TypeVar("E", bound=enum.StrEnum)

__all__ = [
    "BACKOFF_LIMIT",
    "Calibration",
    "ECHO_LIMIT",
    "ModelCpus",
    "Setting",
    "Unexpected",
    "at_least_one",
    "calibration",
    "check_calibration",
    "check_zmq_address",
    "choice",
    "member",
    "file_path_value",
    "flag_value",
    "host_value",
    "integer",
    "is_int",
    "is_loopback",
    "is_number",
    "log_path",
    "log_path_value",
    "model_cpus",
    "model_cpus_value",
    "new_file",
    "new_file_path",
    "number",
    "optional",
    "path_value",
    "port",
    "port_number",
    "positive",
    "setting",
    "readable_file",
    "run_id_value",
    "shown",
    "text_value",
    "threads_value",
    "within",
    "writable_file",
    "zmq_value",
]


BACKOFF_LIMIT = 300.0
"""The longest backoff delay, first or cap (seconds): at the cap, a device that is back is tried
again within five minutes, and the service is never unavailable much longer than its hardware."""


def member(kind: type[E]) -> Callable[[Any], str | None]:
    """The check of a value that must be one of the enum's members (or their values)."""
    return lambda value: None if value in tuple(kind) else one_of(kind)


def port_number(value: Any) -> str | None:
    ok = value is None or (is_int(value) and 0 <= value <= 65535)
    return None if ok else "must be a port number (0 to 65535, 0: any free port; -1: none)"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_loopback(host: str) -> bool:
    """``host`` (an address, or ``localhost``) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_value(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be an IP address or 'localhost'"
    try:
        ok = value == "localhost" or bool(ipaddress.ip_address(value))
    except ValueError:
        ok = False
    return None if ok else "must be an IP address or 'localhost'"


_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_IPC_PATH_MAX = 107  # sun_path, less its terminating NUL


def check_zmq_address(address: str, *, allow_remote: bool = False) -> str:
    """``address`` if a ZeroMQ socket can bind it — ``tcp://HOST:PORT`` (PORT 0 to 65535, 0 or
    ``*``: any free port), ``ipc://PATH`` or ``inproc://NAME`` — on loopback unless
    ``allow_remote``; else :class:`ValueError` saying why."""
    said = f"zmq address {shown(address)}"
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ValueError(f"{said}: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    if scheme == "ipc" and len(rest.encode()) > _IPC_PATH_MAX:
        raise ValueError(f"{said}: an ipc path is at most {_IPC_PATH_MAX} bytes")
    if scheme != "tcp":
        return address  # local by nature
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise ValueError(f"{said}: expected tcp://HOST:PORT")
    digits = port.isascii() and port.isdigit() and len(port.lstrip("0")) <= 5
    if port != "*" and not (digits and int(port) <= 65535):
        raise ValueError(f"{said}: port {shown(port)} is not 0-65535 (0 or *: any free port)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "*" and not _HOSTNAME.fullmatch(host):
            raise ValueError(f"{said}: {shown(host)} is not a host") from None
    if not allow_remote and not is_loopback(host):
        raise ValueError(
            f"{said} is not a loopback address: refused unless allow_remote (--allow-remote) is set"
        )
    return address


def zmq_value(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return "must be a ZeroMQ address (tcp://HOST:PORT, ipc://PATH or inproc://NAME)"
    try:
        check_zmq_address(value, allow_remote=True)
    except ValueError as exc:
        return f"is not one a socket can bind ({str(exc).split(': ', 1)[-1]})"
    return None


def within(low: float, high: float, unit: str = "seconds") -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = is_number(value) and low < value <= high
        return None if ok else f"must be in ({low:g}, {high:g}] {unit}"

    return check


def positive(value: Any) -> str | None:
    ok = is_number(value) and math.isfinite(value) and value > 0
    return None if ok else "must be a finite number of seconds > 0"


def at_least_one(value: Any) -> str | None:
    ok = is_int(value) and value >= 1
    return None if ok else "must be at least 1 frame"


def optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else check(value)


def threads_value(value: Any) -> str | None:
    ok = is_int(value) and 1 <= value <= 256
    return None if ok else "must be a whole number of threads from 1 to 256"


def flag_value(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be True or False"


def path_value(value: Any) -> str | None:
    return None if isinstance(value, Path) else "must be a path"


def text_value(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must be a path (or -)"


def file_path_value(value: Any, what: str = "file") -> str | None:
    ok = isinstance(value, Path) and bool(value.name) and str(value) != "-"
    return None if ok else f"must be the path of a {what}"


def log_path_value(value: Any) -> str | None:
    """A path named as openpilot's reader takes a log (``.zst``, ``.bz2`` or no extension)."""
    if file_path_value(value) is not None:
        return file_path_value(value, "log file")
    try:
        compression_of(value)
    except ValueError:
        return "must be named with .zst (zstd), .bz2 or no extension (plain, e.g. 'rlog')"
    return None


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def run_id_value(value: Any) -> str | None:
    if isinstance(value, str) and _RUN_ID.fullmatch(value):
        return None
    return "must be 1 to 64 letters, digits, '.', '_', ':' or '-', from a letter or digit"


def model_cpus_value(value: Any) -> str | None:
    ok = (
        value is None
        or value == "auto"
        or (
            isinstance(value, tuple)
            and bool(value)
            and all(is_int(cpu) and cpu >= 0 for cpu in value)
        )
    )
    return None if ok else "must be 'auto', None or CPU numbers"


def readable_file(what: str, path: Path, expected: str) -> None:
    with _asking(what, path):
        if not path.is_file():
            found = "no such file" if not path.exists() else "not a regular file"
            found = "a directory" if path.is_dir() else found
            raise ValueError(f"{what} {shown_path(path)}: {found} ({expected})")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{what} {shown_path(path)}: cannot be read (permission denied)")


def new_file(what: str, path: Path) -> None:
    """``path`` can be created (:func:`writable_file`) and nothing is there yet."""
    writable_file(what, path)
    with _asking(what, path):
        if os.path.lexists(path):
            raise ValueError(f"{what} {shown_path(path)} exists: it is written to a new file")


def writable_file(what: str, path: Path) -> None:
    directory, said = path.parent, f"{what} {shown_path(path)}"
    with _asking(what, path):
        if path.is_dir():
            raise ValueError(f"{said} is a directory (expected a file to write)")
        if not directory.is_dir():
            raise ValueError(f"{said}: no such directory {shown_path(directory)}")
        target = path if path.exists() else directory
        if not os.access(target, os.W_OK):
            raise ValueError(f"{said}: cannot be written (permission denied)")


@contextlib.contextmanager
def _asking(what: str, path: Path) -> Iterator[None]:
    """The machine refusing even to look at ``path`` (a name too long, say) is the file check's
    refusal too, in one line."""
    try:
        yield
    except OSError as exc:
        raise ValueError(f"{what} {shown_path(path)}: {exc.strerror or exc}") from None


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
    commands: tuple[str, ...] = ("run", "replay")
    """The commands that take the flag."""
    bare: str | None = None
    """The value of the flag given with none (``--cereal-zmq`` alone); None: a value is needed."""

    def accept(self, name: str, value: Any) -> Any:
        """``value`` for the setting ``name``: parsed if given as text, then checked;
        :class:`ValueError` saying what was expected — every setting's refusal is made here,
        the value refused echoed through :func:`shown` (a text form's :class:`Unexpected`
        echoes what it could not read so)."""
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if self.parse is not None and isinstance(value, str):
            try:
                value = self.parse(value)
            except ValueError as exc:
                said = str(exc)
                if not said.startswith(name):
                    said = f"{name} {said}" if said.startswith("must") else f"{name}: {said}"
                raise ValueError(said) from None
        problem = None if self.check is None else self.check(value)
        if problem is not None:
            raise ValueError(f"{name} {problem}, got {shown(value)}")
        return value


def setting(default: Any, help: str, **how: Any) -> Any:
    """A :class:`ServiceConfig` field: its default and its :class:`Setting`."""
    return field(default=default, metadata={"setting": Setting(help, **how)})

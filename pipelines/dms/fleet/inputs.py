"""A fleet's inputs: the recordings that ``aio-dms fleet INPUTS...`` names, found before any work.

Each INPUT is one of:

- a file: one recording (ours, or a video file), named by its file name;
- an openpilot route segment directory (it holds ``dcamera.hevc``): one recording, named by the
  directory's name;
- any other directory: every recording under it, found walking it in name order — segment
  directories (not looked into further), recordings of ours (their first bytes say) and video
  files (by their extension, :data:`VIDEO_SUFFIXES`); hidden entries and other files are passed
  over. Each is named by its path relative to the directory (``route-1/drive.dmsrec``);
- a text file ending in ``.txt``: a list, one path a line (relative to the list's directory;
  blank lines and lines starting with ``#`` are skipped), each taken as an INPUT given on the
  command line (a list in a list excepted).

A path that does not exist, a list that cannot be read, two recordings of the same name (their
rows would share a ``recording``), and inputs that hold no recording at all are refused
(:class:`ValueError`, one line). Whether a recording can be replayed is not looked at here: one
that cannot fails alone as the fleet replays it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..frames import InputKind, classify

__all__ = ["LIST_SUFFIX", "VIDEO_SUFFIXES", "Recording", "find_recordings"]

LIST_SUFFIX = ".txt"
"""A file of this suffix is a list of inputs."""
VIDEO_SUFFIXES = frozenset({".mp4", ".mkv", ".mov", ".avi", ".webm", ".hevc", ".h265", ".h264"})
"""The video files a directory's walk takes (a video given by name is taken whatever its name)."""


@dataclass(frozen=True)
class Recording:
    """One input of a fleet: its name (the ``recording`` of its rows) and where it is."""

    name: str
    path: Path


def find_recordings(inputs: Iterable[str | os.PathLike[str]]) -> list[Recording]:
    """The recordings ``inputs`` name, in the order given (a directory's in name order), each
    once; :class:`ValueError` in one line for inputs refused (see the module's description)."""
    found: dict[str, Recording] = {}
    seen: set[Path] = set()
    for given in _expand(inputs, listed_in=None):
        recording = Recording(given.name, given.path.absolute())  # as a worker elsewhere sees it
        resolved = recording.path.resolve()
        if resolved in seen:
            continue  # the same file named twice
        seen.add(resolved)
        other = found.get(recording.name)
        if other is not None:
            raise ValueError(
                f"two recordings are named {recording.name!r}: {other.path} and "
                f"{recording.path} (their rows would share a recording name; give their "
                "directories instead, or a list that names one of them)"
            )
        found[recording.name] = recording
    if not found:
        raise ValueError("no recordings found in the inputs given")
    return list(found.values())


def _expand(
    inputs: Iterable[str | os.PathLike[str]], listed_in: Path | None
) -> Iterator[Recording]:
    for given in inputs:
        text = os.fspath(given)
        if not text:
            raise ValueError("INPUTS: expected a file or directory path, got ''")
        path = Path(text)
        if listed_in is not None and not path.is_absolute():
            path = listed_in.parent / path
        where = f" (listed in {listed_in})" if listed_in is not None else ""
        if not path.exists():
            raise ValueError(f"{text}: no such file or directory{where}")
        if path.is_dir():
            if _is_segment(path):
                yield Recording(path.resolve().name, path)
            else:
                yield from _walk(path)
        elif path.suffix == LIST_SUFFIX:
            if listed_in is not None:
                raise ValueError(f"{text}: a list in a list{where}: expected a recording")
            yield from _expand(_listed(path), listed_in=path)
        else:
            yield Recording(path.name, path)


def _listed(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: expected a list of inputs, one a line: {exc}") from None
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _is_segment(path: Path) -> bool:
    return classify(path) is InputKind.SEGMENT


def _walk(root: Path) -> Iterator[Recording]:
    def entries(folder: Path) -> Iterator[Path]:
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            raise ValueError(f"{folder}: the directory cannot be read: {exc}") from None
        for name in names:
            if name.startswith("."):
                continue
            path = folder / name
            if path.is_dir():
                if _is_segment(path):
                    yield path
                else:
                    yield from entries(path)
            elif path.suffix.lower() in VIDEO_SUFFIXES or _is_ours(path):
                yield path

    for path in entries(root):
        yield Recording(path.relative_to(root).as_posix(), path)


def _is_ours(path: Path) -> bool:
    try:
        return classify(path) is InputKind.RECORDING
    except OSError:
        return False  # unreadable: not taken by a walk (named alone, it fails as it is replayed)

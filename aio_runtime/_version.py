"""The version of the ``aio-dms`` distribution, which ships ``aio_runtime``, ``transports`` and
``pipelines`` together (each package's ``__version__`` is this one)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DISTRIBUTION = "aio-dms"
UNKNOWN = "0+unknown"
"""The version of a copy of the packages that is neither installed nor a source checkout."""


def distribution_version() -> str:
    """The installed distribution's version, from its metadata (what ``pip`` installed, an
    editable install included); in a source checkout that was never installed, the version its
    ``pyproject.toml`` declares; else :data:`UNKNOWN`."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return UNKNOWN
    declared = project.get("version") if project.get("name") == DISTRIBUTION else None
    return declared if isinstance(declared, str) else UNKNOWN

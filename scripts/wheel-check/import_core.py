"""Imports every module of the runtime core and the transports, in an environment holding the
wheel without extras: none of them needs more than the bare install brings. Two are left out, each
needing what only its own users install."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

NEEDS_MORE = {
    "aio_runtime.testing.pytest_plugin": "pytest, which loads it",
    "transports.sim.umockdev": "PyGObject (the umockdev extra)",
}

installed = Path(sys.prefix).resolve()
imported = 0
for package_name in ("aio_runtime", "transports"):
    package = importlib.import_module(package_name)
    names = [info.name for info in pkgutil.walk_packages(package.__path__, f"{package_name}.")]
    for name in [package_name, *names]:
        if name in NEEDS_MORE:
            continue
        module = importlib.import_module(name)
        where = Path(module.__file__ or "").resolve()
        if installed not in where.parents:
            sys.exit(f"{name} was imported from {where}, not from the installed wheel")
        imported += 1
print(f"imported {imported} modules of aio_runtime and transports from {installed}")

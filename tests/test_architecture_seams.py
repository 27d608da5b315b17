"""Rules about the code's seams: modules of one concern (and of a size to match), the model-backend
seam the service keeps to, the surface each public module declares, and who may use the test kit."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aio_runtime", "transports", "pipelines")

MAX_LINES = 600
LONG_MODULES: dict[str, str] = {}
"""Modules allowed past :data:`MAX_LINES`, each with its reason."""

MAX_FOLDER_MODULES = 14
"""Modules a folder holds, its ``__init__`` not counted: the unit that should not grow is the
folder, whose name says what belongs in it."""
LARGE_FOLDERS = {
    "aio_runtime/_core": "the runtime's private modules, one concern each, behind the one public "
    "surface of aio_runtime (anyio's _core has 22 the same way)",
}
"""Folders allowed past :data:`MAX_FOLDER_MODULES`, each with its reason."""

SERVICE = "pipelines/dms/service/"
BACKENDS = "pipelines/dms/backends/base.py"
BACKEND_CLASSES = {"CpuBackend", "AcceleratorBackend", "OnnxRunner", "AcceleratorRunner"}

TEST_KIT_USERS = {
    "pipelines/cli/demo.py": "the demonstration plays scripted firmware, which the kit ships",
}
"""Modules outside the test kit that may import it, each with its reason."""


def sources(package: str) -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def long_modules(package: str, limit: int = MAX_LINES) -> dict[str, int]:
    return {
        path: len(text.splitlines())
        for path, text in sources(package)
        if len(text.splitlines()) > limit
    }


def test_no_module_is_longer_than_its_concern_needs():
    found = {path: lines for package in PACKAGES for path, lines in long_modules(package).items()}
    assert set(found) <= set(LONG_MODULES), {
        p: n for p, n in found.items() if p not in LONG_MODULES
    }


def test_the_length_scan_counts_lines(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 10)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 11)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert long_modules("pkg", limit=10) == {"pkg/long.py": 11}


def large_folders(package: str, limit: int = MAX_FOLDER_MODULES) -> dict[str, int]:
    """Folders of ``package`` holding more than ``limit`` modules (``__init__`` not counted)."""
    found = {}
    for folder in sorted({p.parent for p in (ROOT / package).rglob("*.py")}):
        count = sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
        if count > limit:
            found[folder.relative_to(ROOT).as_posix()] = count
    return found


def test_no_folder_holds_more_modules_than_a_reader_takes_in():
    found = {path: n for package in PACKAGES for path, n in large_folders(package).items()}
    assert set(found) <= set(LARGE_FOLDERS), {
        p: n for p, n in found.items() if p not in LARGE_FOLDERS
    }


def test_the_folder_scan_counts_modules_but_the_init(tmp_path, monkeypatch):
    (tmp_path / "pkg" / "big").mkdir(parents=True)
    for name in ("__init__", "a", "b", "c"):
        (tmp_path / "pkg" / "big" / f"{name}.py").write_text("")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert large_folders("pkg", limit=2) == {"pkg/big": 3}
    assert large_folders("pkg", limit=3) == {}


def backend_type_checks(tree: ast.AST) -> list[int]:
    """Lines where ``isinstance``/``issubclass`` tests against a backend or runner class."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass"):
            if (
                len(node.args) == 2
                and {
                    n.id if isinstance(n, ast.Name) else n.attr
                    for n in ast.walk(node.args[1])
                    if isinstance(n, (ast.Name, ast.Attribute))
                }
                & BACKEND_CLASSES
            ):
                lines.append(node.lineno)
    return lines


def test_the_service_tells_backends_apart_by_their_protocol_only():
    found = [
        f"{path}:{line}"
        for path, text in sources("pipelines")
        if path.startswith(SERVICE)
        for line in backend_type_checks(ast.parse(text))
    ]
    assert not found, f"isinstance on a backend class: {found}"


def test_only_the_backend_factory_reads_the_device_kind():
    readers = [
        path
        for path, text in sources("pipelines")
        if path.startswith(SERVICE) and path != BACKENDS and "DeviceKind" in text
    ]
    assert not readers, readers


def test_the_backend_scan_finds_type_checks_on_backends():
    snippet = (
        "isinstance(model, OnnxRunner)\n"
        "isinstance(model, (backends.AcceleratorBackend, int))\n"
        "isinstance(frame, Frame)\n"
    )
    assert backend_type_checks(ast.parse(snippet)) == [1, 2]


def imports_of(tree: ast.AST, path: str) -> set[str]:
    """The modules a file imports, relative imports resolved to dotted names."""
    package = path.removesuffix(".py").replace("/", ".").rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_only_tests_and_named_modules_use_the_test_kit():
    users = {
        path
        for package in ("transports", "pipelines")
        for path, text in sources(package)
        if any(m.startswith("aio_runtime.testing") for m in imports_of(ast.parse(text), path))
    }
    assert users <= set(TEST_KIT_USERS), users - set(TEST_KIT_USERS)


def test_the_import_scan_resolves_relative_imports():
    tree = ast.parse("from ..testing import ScriptedFirmware\nimport anyio.abc\n")
    assert imports_of(tree, "aio_runtime/_core/_x.py") >= {
        "aio_runtime.testing",
        "aio_runtime.testing.ScriptedFirmware",
        "anyio.abc",
    }


def public_modules(package: str) -> Iterator[ModuleType]:
    """Every module of a package reachable without an underscore, imported."""
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    for name in names:
        yield importlib.import_module(name)


def declaration_problems(module: ModuleType) -> list[str]:
    """What a public module's ``__all__`` gets wrong about the classes and functions it defines:
    one left out, a name listed that it lacks, a name listed twice."""
    name = module.__name__
    own = [
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == name
    ]
    listed = list(getattr(module, "__all__", ()))
    if not own and not listed:
        return []
    if "__all__" not in vars(module):
        return [f"{name} defines {own} and has no __all__"]
    return (
        [
            f"{name}.__all__ lists {entry} twice"
            for entry in sorted(set(listed))
            if listed.count(entry) > 1
        ]
        + [
            f"{name}.__all__ lists {entry}, which it lacks"
            for entry in listed
            if not hasattr(module, entry)
        ]
        + [f"{name} does not list {entry} in __all__" for entry in own if entry not in listed]
    )


@pytest.mark.parametrize("package", ["transports", "pipelines"])
def test_every_public_module_declares_what_it_defines(package):
    problems = [
        problem for module in public_modules(package) for problem in declaration_problems(module)
    ]
    assert not problems, "\n".join(problems)


def test_the_declaration_check_finds_each_kind_of_problem():
    fake = ModuleType("fake")
    exec("class Probe: pass\ndef wait(): pass\nfrom pathlib import Path\n", fake.__dict__)
    assert declaration_problems(fake) == ["fake defines ['Probe', 'wait'] and has no __all__"]
    fake.__all__ = ["Probe", "Probe", "Gone"]
    assert declaration_problems(fake) == [
        "fake.__all__ lists Probe twice",
        "fake.__all__ lists Gone, which it lacks",
        "fake does not list wait in __all__",
    ]
    fake.__all__ = ["Probe", "wait"]  # Path is imported, not defined here
    assert declaration_problems(fake) == []


KIND_TABLES = {
    "pipelines/dms/sinks": (
        "SINKS",
        {
            "base": "the protocol, the counting base, the errors every kind shares",
            "file": "the base of the file kinds (jsonl, rlog, parquet): the writer thread",
            "memory": "the in-process subscriptions, always there: no setting turns them on",
            "publish": "several sinks driven as one",
            "zmq_gate": "the ZeroMQ kinds' cap on subscribers",
        },
    ),
    "pipelines/dms/backends": (
        "BACKENDS",
        {
            "base": "the seam: the protocol, the device, open_device",
            "accelerator": "the accelerator's runner and session, over any USB transport",
            "link": "the accelerator's USB link: taken, given back, probed",
        },
    ),
    "pipelines/dms/frames": (
        "SOURCES",
        {
            "frame": "the frame, its geometries and NV12 layout",
            "source": "the source protocol and its pacing",
            "recorded": "the shell of the recorded sources: reading ahead, pacing, skipping",
            "recording": "our recordings' format and writer",
            "recording_reader": "our recordings' reader",
        },
    ),
    "pipelines/cli": (
        "COMMANDS",
        {
            "progress": "the progress line of run, replay and record",
            "replay_compare": "replay's --compare",
            "fleet_compare": "fleet compare, a subcommand the fleet command dispatches",
        },
    ),
}
"""Each folder of kinds: the table in its ``__init__`` and the modules that are not kinds (each
with what it is); every other public module must be a row's."""


@pytest.mark.parametrize("folder", sorted(KIND_TABLES))
def test_every_public_module_of_a_kinds_folder_is_a_row_of_its_table(folder):
    table, shared = KIND_TABLES[folder]
    package = importlib.import_module(folder.replace("/", "."))
    rows = {row.module.lstrip(".") for row in getattr(package, table)}
    public = {path.stem for path in (ROOT / folder).glob("*.py") if not path.name.startswith("_")}
    assert rows <= public, f"rows of {table} without a module: {sorted(rows - public)}"
    assert not rows & set(shared), sorted(rows & set(shared))
    unregistered = public - rows - set(shared)
    assert not unregistered, (
        f"{folder}: modules neither a row of {table} nor shared: {unregistered}"
    )


def test_each_sink_kind_reads_settings_of_the_service_and_opens_its_sinks():
    from pipelines.dms.config.settings import ServiceConfig
    from pipelines.dms.sinks import SINKS

    fields = {item.name for item in dataclasses.fields(ServiceConfig)}
    for kind in SINKS:
        assert set(kind.settings) <= fields, kind
        assert callable(kind.load().open_sinks), kind


def test_each_sink_kind_that_writes_a_file_checks_it_is_new_unless_appended_to(tmp_path):
    from pipelines.dms.config.settings import Mode, ServiceConfig
    from pipelines.dms.sinks import SINKS

    def made(**settings: object) -> ServiceConfig:
        return ServiceConfig(camera=str(tmp_path / "drive.dmsrec"), mode=Mode.REPLAY, **settings)

    names = {"jsonl": "run.jsonl", "rlog": "rlog.zst", "parquet": "run.parquet", "csv": "run.csv"}
    writers = [kind for kind in SINKS if kind.writes_file]
    assert {kind.setting for kind in writers} == set(names)
    for kind in writers:
        name = names[kind.setting]
        (tmp_path / "old").mkdir(exist_ok=True)
        there = tmp_path / "old" / name
        there.write_bytes(b"an earlier run's")
        config = made(**{kind.setting: str(there)})
        with pytest.raises(ValueError, match=f"^{kind.setting} .*exists"):
            kind.check_environment(config)
        kind.check_environment(made(**{kind.setting: str(tmp_path / name)}))
        if kind.appended_by is not None:
            kind.check_environment(dataclasses.replace(config, **{kind.appended_by: True}))
        with pytest.raises(ValueError, match="no such directory"):
            kind.check_environment(made(**{kind.setting: str(tmp_path / "no" / name)}))


def test_each_camera_source_is_a_row_whose_class_reads_the_inputs_it_names(tmp_path):
    from pipelines.dms.config.kinds import CameraFile, Synthetic
    from pipelines.dms.frames import SOURCES, InputKind, source_kind
    from pipelines.dms.frames.source import SourceBase

    inputs = [kind for row in SOURCES for kind in row.inputs]
    assert sorted(inputs, key=str) == sorted(InputKind, key=str)  # each input read by one row
    assert source_kind(Synthetic()) is SOURCES[0] and SOURCES[0].live
    for row in SOURCES:
        assert issubclass(row.load(), SourceBase), row
    (tmp_path / "dir").mkdir()
    (tmp_path / "clip.mp4").write_bytes(b"not a recording")
    assert source_kind(CameraFile(tmp_path / "dir")).name == "segment"
    assert source_kind(CameraFile(tmp_path / "clip.mp4")).name == "video"
    with pytest.raises(FileNotFoundError, match="no such file"):
        source_kind(CameraFile(tmp_path / "gone.mp4"))


def test_each_calibration_setting_chooses_one_calibration_kind():
    from pipelines.dms.frames import CALIBRATIONS, calibration_kind
    from pipelines.dms.frames.synthetic import SyntheticCalibration

    for calib in (None, (0.0, 0.01, -0.02)):
        assert sum(row.chosen(calib) for row in CALIBRATIONS) == 1, calib
    static, synthetic = calibration_kind((0.0, 0.01, -0.02)), calibration_kind(None)
    assert not static.follows and synthetic.follows
    with pytest.raises(ValueError, match="a value, not a stream"):
        static.open()
    assert isinstance(synthetic.open(), SyntheticCalibration)


def test_each_device_kind_is_a_row_of_the_backends_table_whose_module_opens_it():
    from pipelines.dms.backends import BACKENDS, backend_kind
    from pipelines.dms.config.kinds import DeviceKind

    assert [kind.device for kind in BACKENDS] == list(DeviceKind)
    for device in DeviceKind:
        assert callable(backend_kind(device).load().open_device), device

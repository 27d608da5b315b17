"""What the distribution declares and ships: every third-party import declared where it belongs
(the runtime core and the transports on the bare install, the DMS service in the ``dms`` extra),
one version for the three packages, and the DMS commands refused in one line where the extra is
missing. ``make wheel-check`` checks the same on the built wheel, in fresh environments."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import aio_runtime
import pipelines
import transports
from aio_runtime import _version
from pipelines import cli
from pipelines.exit_codes import ExitCode
from pipelines.extras import DMS

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES = ("aio_runtime", "transports", "pipelines")

OPTIONAL_IMPORTS = {
    "trio": "test",  # the core on trio, imported only when running on it
    "pytest": "test",  # the pytest plugin, which only pytest loads
    "gi": "umockdev",  # the simulator as an emulated USB device (tests/umockdev)
    "pyarrow": "fleet",  # Parquet (replay --parquet, fleet replays), imported only for them
    "ray": "fleet",  # fleet replays, imported only for them
    "av": "video",  # video files and route segments as cameras, imported only for them
    "matplotlib": "report",  # the report's plots, imported only for them
}
"""Imports that no installed command needs, or only some option or command of one does, and the
extra that declares each."""

DMS_EXTRA_MODULES = ("onnxruntime", "onnx", "av", "zmq", "prometheus_client", "starlette")


def requirement_names(requirements: list[str]) -> set[str]:
    return {
        re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", line)[0]).lower()
        for line in requirements
    }


def third_party_imports(package: str) -> Iterator[tuple[str, str]]:
    """(module, where) for each import of a module from outside the standard library and the
    three packages, anywhere in ``package`` (inside functions included)."""
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in PACKAGES:
                    yield top, f"{path.relative_to(ROOT)}:{node.lineno}"


@pytest.mark.parametrize(
    ("package", "declared_in"),
    [("aio_runtime", ()), ("transports", ()), ("pipelines", ("dms",))],
)
def test_every_third_party_import_is_declared_where_the_package_belongs(package, declared_in):
    """The core and the transports import only the bare install's dependencies; the pipelines
    those and the dms extra's (``OPTIONAL_IMPORTS`` aside)."""
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    allowed = requirement_names(project["dependencies"])
    for extra in declared_in:
        allowed |= requirement_names(extras[extra])
    providers = importlib.metadata.packages_distributions()
    problems = []
    for module, where in third_party_imports(package):
        distributions = {name.lower().replace("_", "-") for name in providers.get(module, ())}
        if not distributions:
            problems.append(f"{where}: {module} is provided by no installed distribution")
        elif module in OPTIONAL_IMPORTS:
            if not distributions & requirement_names(extras[OPTIONAL_IMPORTS[module]]):
                problems.append(f"{where}: {module} is not in the {OPTIONAL_IMPORTS[module]} extra")
        elif not distributions & allowed:
            problems.append(f"{where}: {module} ({', '.join(sorted(distributions))}) undeclared")
    assert problems == []


def test_the_import_scan_sees_imports_inside_functions(tmp_path, monkeypatch):
    (tmp_path / "transports").mkdir()
    (tmp_path / "transports" / "x.py").write_text(
        "import os\nfrom . import y\nfrom aio_runtime import now\n"
        "def f():\n    import sniffio.abc\n    from zmq import Socket\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert list(third_party_imports("transports")) == [
        ("sniffio", "transports/x.py:5"),
        ("zmq", "transports/x.py:6"),
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_ships_its_type_information(package):
    assert (ROOT / package / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"][package]


def test_the_three_packages_have_the_installed_distribution_s_version(capsys):
    installed = importlib.metadata.version("aio-dms")
    assert aio_runtime.__version__ == transports.__version__ == pipelines.__version__ == installed
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"aio-dms {installed}\n"


def test_a_source_checkout_never_installed_has_the_version_its_pyproject_declares(monkeypatch):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version, "version", not_installed)
    assert _version.distribution_version() == PYPROJECT["project"]["version"]


@pytest.mark.parametrize(
    "pyproject",
    [None, '[project]\nname = "another"\nversion = "9.9"\n', "[project\n"],
    ids=["no pyproject", "another project's", "unreadable"],
)
def test_a_copy_neither_installed_nor_in_its_checkout_has_an_unknown_version(
    monkeypatch, tmp_path, pyproject
):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    (tmp_path / "aio_runtime").mkdir()
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    monkeypatch.setattr(_version, "version", not_installed)
    monkeypatch.setattr(_version, "__file__", str(tmp_path / "aio_runtime" / "_version.py"))
    assert _version.distribution_version() == _version.UNKNOWN


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ModuleType]:
    """``not_installed(*modules)``: from then on, importing any of ``modules`` fails as where it
    is not installed; returns ``pipelines.cli`` imported afresh, as is the DMS service when it
    imports it (so that they meet the failure). All of them are put back afterwards."""
    for module in DMS.imports:  # all that the check imports, so all is put back after it
        importlib.import_module(module)

    def block(*modules: str) -> ModuleType:
        for name in [
            name for name in sys.modules if name.startswith(("pipelines.dms", "pipelines.cli"))
        ]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.delattr(pipelines, "dms")
        monkeypatch.delattr(pipelines, "cli")
        for module in modules:
            for name in [name for name in sys.modules if name.startswith(f"{module}.")]:
                monkeypatch.delitem(sys.modules, name)  # its submodules, loaded, would still import
            monkeypatch.setitem(sys.modules, module, None)
        return importlib.import_module("pipelines.cli")

    return block


@pytest.mark.parametrize("missing", ["onnxruntime", "sniffio", "zmq", "hypercorn"])
@pytest.mark.parametrize(
    "argv",
    [["run", "--frames", "1"], ["replay", "drive.dmsrec", "--device", "cpu"], ["model-info"]],
    ids=["run", "replay", "model-info"],
)
def test_a_dms_command_without_the_dms_extra_names_what_is_missing_and_what_to_install(
    not_installed, capsys, argv, missing
):
    assert not_installed(missing).main(argv) == ExitCode.REFUSED
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"aio-dms {argv[0]}: the DMS service needs the dms extra, which is not installed "
        f"(no module named '{missing}'): pip install 'aio-dms[dms]'\n"
    )


def test_without_the_dms_extra_version_help_and_demo_still_work(not_installed, capsys):
    lean = not_installed(*DMS_EXTRA_MODULES)
    with pytest.raises(SystemExit) as exit_:
        lean.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"aio-dms {pipelines.__version__}\n"
    with pytest.raises(SystemExit) as exit_:
        lean.main(["--help"])
    assert exit_.value.code == 0
    assert "(needs the dms extra: pip install 'aio-dms[dms]')" in capsys.readouterr().out
    assert lean.main(["demo"]) == ExitCode.OK
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("demo done:")
    assert "pipelines.dms.service" not in sys.modules


def test_a_module_of_the_project_that_fails_to_import_is_no_missing_extra(not_installed):
    broken = not_installed("pipelines.dms.service.endpoints")
    with pytest.raises(ModuleNotFoundError) as error:
        broken.main(["run", "--frames", "1"])
    assert error.value.name == "pipelines.dms.service.endpoints"


def test_report_without_matplotlib_names_what_is_missing_and_what_to_install(
    not_installed, capsys, tmp_path
):
    run = tmp_path / "run.jsonl"
    run.write_text("")
    assert not_installed("matplotlib").main(["report", str(run), "-o", str(tmp_path / "out")]) == (
        ExitCode.REFUSED
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "aio-dms report: the report's plots need the report extra, which is not installed "
        "(no module named 'matplotlib'): pip install 'aio-dms[report]'\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("camera", ["video", "segment"])
def test_a_video_camera_without_the_video_extra_is_refused_naming_it(
    not_installed, capsys, tmp_path, camera
):
    if camera == "video":
        path = tmp_path / "cabin.mp4"
        path.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(64))
    else:
        path = tmp_path / "a--0"
        path.mkdir()
        (path / "dcamera.hevc").write_bytes(b"\x00\x00\x01" + bytes(64))
        (path / "rlog").write_bytes(b"")
    argv = ["run", "--camera", str(path), "--frames", "1", "--health-port", "0"]
    assert not_installed("av").main(argv) == ExitCode.REFUSED
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"aio-dms run: camera {str(path)!r}: video files and route segments need the video "
        "extra, which is not installed (no module named 'av'): pip install 'aio-dms[video]'\n"
    )

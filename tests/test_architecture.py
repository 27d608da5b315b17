"""Rules about the code itself: layering, one wait primitive, the public surface."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aio_runtime", "transports", "pipelines")

# Where sleeping or spinning is allowed: the wait primitive and the watcher thread.
WAIT_MODULES = {"aio_runtime/_core/_waits.py", "aio_runtime/_core/_watcher.py"}
# The simulator is the hardware: its engines wait for work and model latency by sleeping.
SIMULATOR = "transports/sim/"
SLEEP_CALLS = {"sleep", "sleep_until", "sleep_forever", "checkpoint", "cancel_shielded_checkpoint"}
# pause() is the bounded sleep between attempts; in a loop anywhere else it is a polling loop.
RETRY_LOOPS = {"aio_runtime/_core/_supervision.py", "aio_runtime/testing/_scripted.py"}
# A camera source is a clock-driven producer: a frame exists once its capture period has passed,
# so sources pace by sleeping until each frame's instant on the loop clock. That is no wait on
# hardware (the instant is known and always reached). One function does it, with sleep_until() only.
CAMERA_PACING = ("pipelines/dms/frames/source.py", "wait_until_ns", "sleep_until")


def camera_pacing_calls(path: str, tree: ast.AST) -> set[ast.Call]:
    """The sleep_until() calls inside the camera's pacing function (the one allowed sleep)."""
    module, function, allowed = CAMERA_PACING
    if path != module:
        return set()
    return {
        call
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef) and node.name == function
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and call_name(call) == allowed
    }


def sources(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def imported_top_levels(tree: ast.AST, module_path: str) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.add(module_path.split("/")[0])
            elif node.module:
                names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("aio_runtime", {"transports", "pipelines"}), ("transports", {"pipelines"})],
)
def test_imports_only_point_down(package, forbidden):
    offenders = {
        path: sorted(imported_top_levels(tree, path) & forbidden)
        for path, tree in sources(package)
        if imported_top_levels(tree, path) & forbidden
    }
    assert not offenders, f"{package} must not import {sorted(forbidden)}: {offenders}"


# -- the import graph -------------------------------------------------------------------------------


def package_modules() -> dict[str, str]:
    """Every module of the three packages: dotted name -> path (a package is its __init__)."""
    names = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join(parts)] = path.relative_to(ROOT).as_posix()
    return names


def import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: not those inside functions
    (they run when called) nor under ``if TYPE_CHECKING:`` (they never run)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If):
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
            if name != "TYPE_CHECKING":
                yield from import_time_nodes(node.body)
            yield from import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from import_time_nodes(block)
        elif isinstance(node, (ast.ClassDef, ast.With, ast.For, ast.While)):
            yield from import_time_nodes(node.body)


def imported_modules(
    module: str, is_package: bool, nodes: Iterable[ast.Import | ast.ImportFrom], known: set[str]
) -> set[str]:
    """The modules of ``known`` that the import statements ``nodes`` of ``module`` execute
    directly: each imported module and the packages above it (importing ``a.b.c`` runs
    ``a/__init__`` and ``a/b/__init__`` first) — except the packages above ``module`` itself,
    which are always imported before it runs."""
    targets: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
            continue
        if node.level:  # relative: from the module's own package, one level up per extra dot
            package = module if is_package else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        targets.add(base)
        targets |= {
            f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known
        }
    ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    executed = set()
    for target in targets:
        parts = target.split(".")
        executed |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return (executed & known) - ancestors - {module}


def runtime_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that may run: at import time or when a function is called — all
    but those under ``if TYPE_CHECKING:`` (they never run)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
            else:
                visit(child)

    visit(tree)
    return found


def import_graph(*, later_too: bool = False) -> dict[str, set[str]]:
    """Which module imports which: at import time (``later_too``: and inside functions)."""
    names = package_modules()
    known = set(names)
    graph = {}
    for module, path in names.items():
        tree = ast.parse((ROOT / path).read_text(), filename=path)
        nodes = runtime_nodes(tree) if later_too else list(import_time_nodes(tree.body))
        graph[module] = imported_modules(module, path.endswith("__init__.py"), nodes, known)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_modules_import_one_another_without_a_cycle():
    """Not at import time, and not through an import inside a function either: one runs later,
    but a module whose function imports the module that imports it is one concept cut in two
    (a factory in the base module that knows its subclasses)."""
    cycle = find_cycle(import_graph(later_too=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_cycle_check_sees_a_cycle_through_a_package_init():
    """The shape of a cycle that once slipped through: ``p.copy`` imports ``p.gpu.queues``, which
    runs ``p/gpu/__init__``, which imports ``p.gpu.session``, which imports ``p.copy``."""
    known = {"p", "p.copy", "p.gpu", "p.gpu.queues", "p.gpu.session"}
    sources = {
        "p": ("", True),
        "p.copy": ("from .gpu.queues import Ring\n", False),
        "p.gpu": ("from .session import Session\n", True),
        "p.gpu.queues": ("import struct\n", False),
        "p.gpu.session": (
            "from typing import TYPE_CHECKING\nfrom ..copy import Copy\n"
            "if TYPE_CHECKING:\n    from . import queues\n",
            False,
        ),
    }
    graph = {
        name: imported_modules(name, is_package, import_time_nodes(ast.parse(text).body), known)
        for name, (text, is_package) in sources.items()
    }
    assert graph["p.copy"] == {"p.gpu", "p.gpu.queues"}
    assert graph["p.gpu.session"] == {"p.copy"}  # its own package is not an edge
    assert find_cycle(graph) == ["p.copy", "p.gpu", "p.gpu.session", "p.copy"]
    later = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..copy import Copy\n"
        "def f():\n    from ..copy import Copy\n"
    )
    graph["p.gpu.session"] = imported_modules(
        "p.gpu.session", False, import_time_nodes(later.body), known
    )
    assert find_cycle(graph) is None  # an import inside a function runs later, not at import
    graph["p.gpu.session"] = imported_modules("p.gpu.session", False, runtime_nodes(later), known)
    assert find_cycle(graph) == ["p.copy", "p.gpu", "p.gpu.session", "p.copy"]  # but it may run
    typing_only = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.copy\n"
    )
    assert not runtime_nodes(typing_only)[1:]  # only the typing import itself


# The DMS package's folders (and its top-level modules), ranked bottom-up in the chain's order:
# a module imports from its own folder and from folders of lower rank only — at import time,
# inside a function and for a type checker alike, since each is a dependency of the code. The
# package's own __init__ (the embedding facade, which imports lazily) stands above them all and
# is imported by none of them; the commands (pipelines.cli) stand above the package.
DMS = "pipelines.dms"
DMS_RANKS = {
    "files": 0,  # files written whole
    "messages": 1,  # the published message
    "summary": 1,  # a run's summary document
    "openpilot": 2,  # openpilot's formats: cereal Events, logs, segments' logs
    "config": 3,  # every setting, declared once
    "frames": 4,  # frames and their sources
    "model": 4,  # what the model takes and gives
    "sinks": 4,  # where messages go
    "backends": 5,  # where the model runs
    "service": 6,  # the chain
    "fleet": 7,  # replays of many recordings
    "report": 8,  # pictures of runs and fleets
}
MAX_DMS_TOP = 6
"""Modules at the top of the DMS package, its __init__ included."""


def all_import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, wherever it is: at import time, in a function, for type checking."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def dms_part(module: str) -> str | None:
    """The ranked part of the DMS package ``module`` belongs to; ``""`` for the package itself,
    None outside it."""
    if module == DMS:
        return ""
    if not module.startswith(DMS + "."):
        return None
    return module.split(".")[2]


def facade_names(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]
) -> list[str]:
    """The names ``node`` takes from the DMS package's facade (not its submodules)."""
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base != DMS:
        return []
    return [a.name for a in node.names if f"{DMS}.{a.name}" not in known]


def arrows_against_rank(
    sources: dict[str, tuple[str, bool]], known: set[str], ranks: dict[str, int]
) -> list[str]:
    """``module -> target`` for each import (anywhere in the module) from one ranked part of
    the DMS package to another of the same or a higher rank, or to the package's facade."""
    found = []
    for module, (text, is_package) in sorted(sources.items()):
        part = dms_part(module)
        if not part:
            continue
        nodes = all_import_nodes(ast.parse(text))
        targets = imported_modules(module, is_package, nodes, known)
        if any(facade_names(module, is_package, node, known) for node in nodes):
            targets.add(DMS)  # the facade is an ancestor, which imported_modules leaves out
        for target in sorted(targets):
            other = dms_part(target)
            if other is None or other == part:
                continue
            if other == "" or ranks[other] >= ranks[part]:
                found.append(f"{module} -> {target}")
    return found


def test_the_dms_folders_import_only_folders_below_them():
    names = package_modules()
    sources = {
        module: ((ROOT / path).read_text(), path.endswith("__init__.py"))
        for module, path in names.items()
        if dms_part(module) is not None
    }
    unranked = sorted({p for m in sources if (p := dms_part(m)) and p not in DMS_RANKS})
    assert not unranked, f"parts of {DMS} without a rank in DMS_RANKS: {unranked}"
    found = arrows_against_rank(sources, set(names), DMS_RANKS)
    assert not found, "imports that point up or sideways:\n" + "\n".join(found)


def test_the_dms_package_keeps_few_modules_at_its_top():
    top = sorted(p.name for p in (ROOT / "pipelines" / "dms").glob("*.py"))
    assert len(top) <= MAX_DMS_TOP, top


def test_the_rank_check_sees_every_kind_of_import_against_the_ranks():
    ranks = {"low": 0, "mid": 1, "high": 2}
    known = {DMS, *(f"{DMS}.{n}" for n in ranks), *(f"{DMS}.{n}.x" for n in ranks)}
    sources = {
        f"{DMS}.low.x": ("def f():\n    from ..high.x import y\n", False),  # up, in a function
        f"{DMS}.mid.x": (
            "from typing import TYPE_CHECKING\nfrom ..low import x\n"
            "if TYPE_CHECKING:\n    from ..mid2 import z\n",
            False,
        ),
        f"{DMS}.high.x": ("from .. import DmsService\nfrom ..mid.x import y\n", False),
    }
    ranks["mid2"] = 1
    known |= {f"{DMS}.mid2"}
    assert arrows_against_rank(sources, known, ranks) == [
        f"{DMS}.high.x -> {DMS}",  # the facade
        f"{DMS}.low.x -> {DMS}.high",
        f"{DMS}.low.x -> {DMS}.high.x",
        f"{DMS}.mid.x -> {DMS}.mid2",  # sideways, for the type checker only
    ]


# The simulator is one backend among others: outside it, nothing imports it, but for these users.
SIMULATOR_USERS = {
    # the simulated GPU that runs the model as its kernel
    "pipelines/dms/backends/sim.py",
    # the backend factory: the accelerator simulated in this process, one device kind of several
    "pipelines/dms/backends/base.py",
    # the service's fault injection: its faults are the simulator's, scripted on its fault plan
    "pipelines/dms/config/faults.py",
    "pipelines/dms/service/_faults.py",
}


def simulator_imports(module: str, path: str, tree: ast.AST, known: set[str]) -> set[str]:
    """The simulator's modules that ``module`` imports anywhere (at import time or later)."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    imported = imported_modules(module, path.endswith("__init__.py"), nodes, known)
    return {m for m in imported if m == "transports.sim" or m.startswith("transports.sim.")}


def test_nothing_outside_the_simulator_imports_it_but_its_documented_users():
    names = package_modules()
    offenders = {
        path: sorted(found)
        for module, path in names.items()
        if not path.startswith(SIMULATOR) and path not in SIMULATOR_USERS
        if (
            found := simulator_imports(
                module, path, ast.parse((ROOT / path).read_text()), set(names)
            )
        )
    }
    assert not offenders, f"modules that import the simulator: {offenders}"


def test_the_simulator_check_sees_an_import_inside_a_function():
    known = {"transports", "transports.sim", "transports.sim.bridge", "transports.usb"}
    tree = ast.parse("def open():\n    from ..sim.bridge import SimBridge\n")
    found = simulator_imports("transports.usb", "transports/usb/__init__.py", tree, known)
    assert found == {"transports.sim", "transports.sim.bridge"}


def test_importing_the_usb_transports_does_not_load_the_simulator():
    graph = import_graph()
    for module in [m for m in graph if m == "transports.usb" or m.startswith("transports.usb.")]:
        parts = module.split(".")
        loaded, todo = set(), [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        while todo:
            name = todo.pop()
            if name not in loaded:
                loaded.add(name)
                todo.extend(graph.get(name, ()))
        simulator = sorted(m for m in loaded if m.startswith("transports.sim"))
        assert not simulator, f"importing {module} loads {simulator}"


def vendor_request_literals(path: str, tree: ast.AST) -> list[str]:
    """Integer literals spelling one of the bridge's vendor requests, outside the protocol module
    that names them (:class:`transports.protocol.bridge.VendorRequest`)."""
    from transports.protocol.bridge import VendorRequest

    if path.startswith("transports/protocol/"):
        return []
    codes = {int(request) for request in VendorRequest}
    return [
        f"{path}:{node.lineno}: 0x{node.value:X}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in codes
    ]


def test_the_bridge_s_vendor_requests_are_named_not_spelled_as_numbers():
    found = [
        hit for path, tree in sources("transports") for hit in vendor_request_literals(path, tree)
    ]
    assert not found, "\n".join(found)


def test_the_vendor_request_scan_sees_a_bare_request_code():
    tree = ast.parse("await usb.control_out(0x40, 0xE4, 0, 0)\n")
    assert vendor_request_literals("transports/bridge.py", tree) == ["transports/bridge.py:1: 0xE4"]
    assert not vendor_request_literals("transports/protocol/bridge.py", tree)


FIRST_IMPORTS = """
import importlib, sys
packages, names = sys.argv[1].split(","), sys.argv[2:]
for name in names:
    for loaded in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}")
"""


def test_every_module_imports_first_in_a_fresh_interpreter():
    """Each module imported as the first of the three packages' (the others forgotten before it),
    so that no module works only because another was imported before it."""
    names = sorted(package_modules())
    done = subprocess.run(
        [sys.executable, "-c", FIRST_IMPORTS, ",".join(PACKAGES), *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not done.stdout.strip(), done.stdout


def call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def stray_waits(path: str, tree: ast.AST) -> list[str]:
    """Sleeps and yield-spins outside the wait primitive; ``pause()`` in a loop (a polling loop);
    ``while`` loops that poll a call without awaiting; loops in coroutines that never await (they
    block the event loop)."""
    found = []
    if path in WAIT_MODULES:
        return found
    pacing = camera_pacing_calls(path, tree)
    for node in ast.walk(tree):
        simulated = path.startswith(SIMULATOR)
        if (
            isinstance(node, ast.Call)
            and call_name(node) in SLEEP_CALLS
            and not simulated
            and node not in pacing
        ):
            found.append(f"{path}:{node.lineno}: {call_name(node)}() outside the wait primitive")
        if isinstance(node, (ast.While, ast.For, ast.AsyncFor)) and path not in RETRY_LOOPS:
            if any(isinstance(n, ast.Call) and call_name(n) == "pause" for n in ast.walk(node)):
                found.append(f"{path}:{node.lineno}: pause() in a loop (a polling loop)")
        if isinstance(node, ast.While):
            test_calls = [n for n in ast.walk(node.test) if isinstance(n, ast.Call)]
            body_awaits = any(isinstance(n, ast.Await) for n in ast.walk(node))
            if test_calls and not body_awaits:
                found.append(f"{path}:{node.lineno}: a while loop polling a call")
        if isinstance(node, ast.AsyncFunctionDef):
            for loop in ast.walk(node):
                # an async generator's yield hands control to its consumer: that suspends too
                if isinstance(loop, ast.While) and not any(
                    isinstance(n, (ast.Await, ast.Yield)) for n in ast.walk(loop)
                ):
                    found.append(f"{path}:{loop.lineno}: a loop in a coroutine that never awaits")
    return sorted(set(found))


def test_every_wait_goes_through_the_primitive():
    found = [
        hit
        for package in PACKAGES
        for path, tree in sources(package)
        for hit in stray_waits(path, tree)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "import time\nwhile read() < 5:\n    time.sleep(0.001)\n",
        "async def f():\n    while True:\n        if read():\n            return\n"
        "        await asyncio.sleep(0.001)\n",
        "async def f():\n    await anyio.lowlevel.checkpoint()\n",
        "while not ready():\n    pass\n",
        "async def f():\n    while read() < 5:\n        await pause(0.001)\n",
        "async def f():\n    while True:\n        if read():\n            return\n",
    ],
)
def test_the_scan_catches_polling_and_sleep_loops(snippet):
    assert stray_waits("pipelines/x.py", ast.parse(snippet))


def test_the_camera_may_pace_with_sleep_until_in_its_pacing_function_only():
    path = CAMERA_PACING[0]
    allowed = "async def wait_until_ns(t):\n    await anyio.sleep_until(t)\n"
    assert not stray_waits(path, ast.parse(allowed))
    for snippet in (
        "async def wait_until_ns(t):\n    await anyio.sleep(t)\n",
        "async def elsewhere(t):\n    await anyio.sleep_until(t)\n",
    ):
        assert stray_waits(path, ast.parse(snippet))
    assert stray_waits("pipelines/dms/other.py", ast.parse(allowed))


def ledger_kind_literals(path: str, tree: ast.AST) -> list[tuple[str, str]]:
    """``(where, kind)`` for every ledger entry opened with a string literal as its kind
    (``ledger.open("usb transfer", ...)``, ``current_ledger().open(...)``)."""
    return [
        (f"{path}:{node.lineno}", node.args[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "open"
        and "ledger" in ast.unparse(node.func.value).lower()
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]


def test_every_ledger_kind_spelled_as_a_string_is_a_ledger_kind_member():
    from aio_runtime import LedgerKind

    unknown = [
        f"{where}: {kind!r}"
        for package in PACKAGES
        for path, tree in sources(package)
        for where, kind in ledger_kind_literals(path, tree)
        if kind not in set(LedgerKind)
    ]
    assert not unknown, f"ledger kinds missing from LedgerKind: {unknown}"


def test_the_ledger_kind_scan_finds_string_kinds_on_any_ledger():
    snippet = (
        'ledger.open("dma buffer", what)\n'
        'current_ledger().open("host mapping", what)\n'
        "self._ledger.open(LedgerKind.STAGE, what)\n"
        'path.open("rb")\n'
    )
    found = ledger_kind_literals("transports/x.py", ast.parse(snippet))
    assert found == [("transports/x.py:1", "dma buffer"), ("transports/x.py:2", "host mapping")]


# The public surface: aio_runtime and aio_runtime.testing, each with an __all__; every other module
# of the core is private, except the pytest plugin, which pyproject.toml names as an entry point.
PUBLIC_MODULES = ("aio_runtime", "aio_runtime.testing")
PUBLIC_BY_NAME = {"aio_runtime.testing.pytest_plugin"}


def surface_problems(module: ModuleType) -> list[str]:
    """What is wrong with a public module's ``__all__``: missing, listing a name twice or a name
    the module lacks, or leaving out a public name the module has (other than a submodule)."""
    name = module.__name__
    if "__all__" not in vars(module):
        return [f"{name} has no __all__"]
    listed = list(module.__all__)
    twice = sorted({entry for entry in listed if listed.count(entry) > 1})
    return (
        [f"{name}.__all__ lists {entry} twice" for entry in twice]
        + [
            f"{name}.__all__ lists {entry}, which {name} lacks"
            for entry in listed
            if not hasattr(module, entry)
        ]
        + [
            f"{name} does not list its public name {attribute} in __all__"
            for attribute, value in vars(module).items()
            if not attribute.startswith("_")
            and not isinstance(value, ModuleType)
            and attribute not in listed
        ]
    )


def module_names(package_dir: Path, package: str) -> Iterator[str]:
    """Every module and subpackage below a package's folder, by dotted name."""
    for info in pkgutil.iter_modules([str(package_dir)]):
        name = f"{package}.{info.name}"
        yield name
        if info.ispkg:
            yield from module_names(package_dir / info.name, name)


def public_implementation_modules(package_dir: Path, package: str) -> list[str]:
    """Modules below ``package`` reachable without an underscore that are not public on purpose."""
    return [
        name
        for name in module_names(package_dir, package)
        if not any(part.startswith("_") for part in name.split(".")[1:])
        and name not in PUBLIC_MODULES
        and name not in PUBLIC_BY_NAME
    ]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_a_public_module_lists_exactly_its_public_names_in_all(name):
    assert surface_problems(importlib.import_module(name)) == []


def test_the_core_has_no_public_implementation_modules():
    assert public_implementation_modules(ROOT / "aio_runtime", "aio_runtime") == []


@pytest.mark.parametrize(
    ("package", "modules"),
    [("aio_runtime", "aio_runtime._core"), ("aio_runtime.testing", "aio_runtime.testing")],
)
def test_every_name_a_private_module_lists_in_all_is_exported(package, modules):
    exported = set(importlib.import_module(package).__all__)
    for info in pkgutil.iter_modules([str(ROOT.joinpath(*modules.split(".")))]):
        if info.name.startswith("_"):
            module = importlib.import_module(f"{modules}.{info.name}")
            missing = sorted(set(getattr(module, "__all__", ())) - exported)
            assert not missing, (
                f"{module.__name__} lists {missing}, which {package} does not export"
            )


def test_the_surface_check_finds_each_kind_of_problem():
    fake = ModuleType("fake")
    fake.Probe = type("Probe", (), {})
    fake.wait = lambda: None
    fake.helper = lambda: None
    fake.submodule = ModuleType("fake.submodule")
    fake._private = object()
    assert surface_problems(fake) == ["fake has no __all__"]
    fake.__all__ = ["Probe", "wait", "wait", "Gone"]
    assert surface_problems(fake) == [
        "fake.__all__ lists wait twice",
        "fake.__all__ lists Gone, which fake lacks",
        "fake does not list its public name helper in __all__",
    ]
    fake.__all__ = ["Probe", "helper", "wait"]
    assert surface_problems(fake) == []


def test_the_module_scan_finds_public_implementation_modules(tmp_path):
    for module in (
        "__init__",
        "_private",
        "public",
        "testing/__init__",
        "testing/pytest_plugin",
        "testing/helpers",
        "_core/__init__",
        "_core/_waits",
        "_core/shared",
    ):
        path = tmp_path / "aio_runtime" / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    found = public_implementation_modules(tmp_path / "aio_runtime", "aio_runtime")
    assert sorted(found) == ["aio_runtime.public", "aio_runtime.testing.helpers"]

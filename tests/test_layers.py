"""The package's layers are enforced, not described (ARCHITECTURE.md).

Three checks, each on the source files (nothing of the package is imported here):

1. the import-linter contracts of ``pyproject.toml`` (``[tool.importlinter]``): the layers
   ``cli > diagnostics > catalogue > infer > guides > models > data > symmetry > core`` and no
   cycle between the modules of any package;
2. the import graph of the package's modules -- every import of a package module, at module level
   or inside a function, apart from ``if TYPE_CHECKING:`` blocks -- has no cycle;
3. no function imports a package module (imports are at the top of a module, where they show the
   module's dependencies; optional heavy libraries come lazily through ``pyro_invariance._optional``).

``models/`` and ``guides/`` are installed as ``pyro_invariance.models`` and ``pyro_invariance.guides``
(``[tool.setuptools.package-dir]``); the checks map them there.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pyro_invariance"
#: where each package's files are: the installed layout (pyproject's package-dir)
SOURCES = {PACKAGE: ROOT / PACKAGE, f"{PACKAGE}.models": ROOT / "models", f"{PACKAGE}.guides": ROOT / "guides"}


def package_modules() -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package's __init__)}`` for every module of the package."""
    out = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if prefix == PACKAGE and parts[0] in ("models", "guides"):
                continue
            is_package = parts[-1] == "__init__"
            name = ".".join([prefix, *(parts[:-1] if is_package else parts)])
            out[name] = (path, is_package)
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def package_imports(module: str, path: Path, is_package: bool, modules: set[str]) -> list[tuple[str, int, bool]]:
    """The package modules ``module`` imports: ``(imported module, line, inside a function)``.

    ``from a import b`` imports ``a.b`` when that is a module, else ``a``; relative imports are
    resolved; ``if TYPE_CHECKING:`` blocks are skipped (they never run).
    """
    found: list[tuple[str, int, bool]] = []

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_node(other, in_function)
                continue
            visit_node(child, in_function)

    def visit_node(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            visit(node, True)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.append((known(alias.name), node.lineno, in_function))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base == PACKAGE or base.startswith(PACKAGE + "."):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in modules else known(base), node.lineno, in_function))
        else:
            visit(node, in_function)

    visit(ast.parse(path.read_text(), str(path)), False)
    return [(name, line, local) for name, line, local in found if name is not None]


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """The graph ``{module: modules it imports}`` (all imports but TYPE_CHECKING ones) and the
    function-local imports of package modules, as ``"file:line imports module"``."""
    modules = package_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    local = []
    for name, (path, is_package) in modules.items():
        for imported, line, in_function in package_imports(name, path, is_package, set(modules)):
            if imported != name:
                graph[name].add(imported)
            if in_function:
                local.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    return graph, local


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_scan_sees_the_whole_package():
    graph, _ = import_graph()
    for name in (PACKAGE, f"{PACKAGE}.cli", f"{PACKAGE}.models.base", f"{PACKAGE}.guides.base", f"{PACKAGE}.tasks"):
        assert name in graph
    assert f"{PACKAGE}.models.base" in graph[f"{PACKAGE}.infer.training"]  # an absolute import
    assert f"{PACKAGE}.models.base" in graph[f"{PACKAGE}.models.invariant_mlp"]  # a relative one


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph()[0])
    assert cycle is None, "import cycle (function-level imports included): " + " -> ".join(cycle or [])


def test_no_package_imports_inside_functions():
    _, local = import_graph()
    assert not local, (
        f"{len(local)} imports of package modules inside functions (import at the module's top; an optional "
        "heavy library goes through pyro_invariance._optional):\n  " + "\n  ".join(local)
    )


@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package's sources laid out as installed (models/ and guides/ inside it), which
    import-linter reads from the file system."""
    root = tmp_path_factory.mktemp("layout")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.npz", "*.json")
    for name, folder in SOURCES.items():
        target = root.joinpath(*name.split("."))
        shutil.copytree(folder, target, ignore=ignore, dirs_exist_ok=True)
    return root


def test_import_linter_contracts(installed_layout: Path):
    pytest.importorskip("importlinter")
    lint = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c(sys.argv[1:]))"
    command = [sys.executable, "-c", lint, str(ROOT / "pyproject.toml"), "--no-cache"]
    env = {"PYTHONPATH": str(installed_layout), "PATH": "", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(command, cwd=installed_layout, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout, run.stdout

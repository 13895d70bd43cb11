"""The engine's shape, read from the source: what may import what, and how big a module may grow."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_FREE = (
    "engine.errors",
    "engine.paths",
    "engine.settings",
    "engine.events",
    "engine.stats",
    "engine.backend",
)
MAX_LINES = 500  # the formatter wraps calls; a module over this says why
LONG_REASON = "Longer than usual because"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def engine_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in (ROOT / "engine").rglob("*.py")}
    return {
        name: {m for m in imported_modules(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return result


def allowed_imports() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """DEVELOPERS.md's table: each part's module prefixes, and the parts it may import."""
    modules, may_import = {}, {}
    table = (ROOT / "DEVELOPERS.md").read_text().split("<!-- the architecture test reads", 1)[1]
    for line in table.splitlines()[3:]:
        if not line.startswith("|"):
            break
        part, prefixes, _, allowed = (cell.strip() for cell in line.strip("|").split("|"))
        modules[part] = re.findall(r"`([\w.]+)`", prefixes)
        may_import[part] = set(re.findall(r"`(\w+)`", allowed)) | {part, "root"}
    return modules, may_import


def part_of(module: str, modules: dict[str, list[str]]) -> str | None:
    """The part whose longest prefix names `module`."""
    best, length = None, -1
    for part, prefixes in modules.items():
        for prefix in prefixes:
            named = module == prefix or (prefix != "engine" and module.startswith(prefix + "."))
            if named and len(prefix) > length:
                best, length = part, len(prefix)
    return best


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    modules, may_import = allowed_imports()
    found = []
    for importer, imported in graph.items():
        source = part_of(importer, modules)
        if source is None:
            found.append(f"{importer}: in no part of DEVELOPERS.md's table")
            continue
        for target in sorted(imported):
            if part_of(target, modules) not in may_import[source]:
                found.append(f"{importer} -> {target}")
    return found


def test_every_import_is_one_developers_md_allows():
    modules, may_import = allowed_imports()
    assert {"root", "kernels", "models", "runtime", "decoding", "session", "cli"} <= set(modules)
    assert forbidden_imports(engine_graph()) == []


def test_the_table_check_catches_an_import_back_up():
    graph = engine_graph()
    graph["engine.kernels.block_quant"] = graph["engine.kernels.block_quant"] | {"engine.session"}
    graph["engine.models.loading"] = graph["engine.models.loading"] | {"engine.decoding.sampling"}
    assert forbidden_imports(graph) == [
        "engine.kernels.block_quant -> engine.session",
        "engine.models.loading -> engine.decoding.sampling",
    ]


def test_no_import_cycle_inside_engine():
    graph = engine_graph()
    assert "engine.session" in graph and graph["engine.session"], "the graph reader found no imports"
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_engine_never_imports_qt():
    offenders = {
        module_name(path): sorted(m for m in imported_modules(path) if m.split(".")[0] in ("PySide6", "app"))
        for path in (ROOT / "engine").rglob("*.py")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_app_imports_qt_only_through_its_seam():
    offenders = {
        module_name(path): sorted(m for m in imported_modules(path) if m.startswith("PySide6"))
        for path in (ROOT / "app").rglob("*.py")
        if path.name != "qt.py"
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_gui_modules_import_neither_torch_nor_transformers():
    """What the GUI thread imports at start-up stays torch-free; the worker imports torch."""
    code = (
        "import sys\n"
        f"import {', '.join(TORCH_FREE)}\n"
        "import app.main, app.main_window\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_modules_stay_small_or_say_why():
    too_long = []
    for path in list((ROOT / "engine").rglob("*.py")) + list((ROOT / "app").rglob("*.py")):
        lines = path.read_text().count("\n")
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and LONG_REASON not in docstring:
            too_long.append(f"{module_name(path)}: {lines} lines")
    assert too_long == []

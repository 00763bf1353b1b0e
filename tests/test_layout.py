"""The house's rooms: every import inside specrt/ and export/ points down the layers, none goes round in a
cycle, no module outgrows a reader, and each subpackage says what it owns and what it must not import.

Imports are read from the source (module level and inside functions alike), so a lazy import that breaks
the layering is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOUNDATION = {"specrt.errors", "specrt.options", "specrt.stats", "specrt.version"}
TOP = {"specrt", "specrt.__main__", "specrt.cli", "specrt.bench", "specrt.prompts"}
# Each room and the rooms it may import from (besides itself). Top-level modules (CLI, bench, the public
# names) may import anything.
ALLOWED = {
    "foundation": set(),
    "bundle": {"foundation"},
    "runtime": {"foundation", "bundle"},
    "decoding": {"foundation"},
    "tuning": {"foundation", "bundle", "runtime"},
    "engine": {"foundation", "bundle", "runtime", "decoding", "tuning"},
    "serve": {"foundation"},
    "scale": {"foundation", "bundle", "engine", "serve"},
    "export": {"foundation", "bundle", "runtime"},
}
MAX_LINES = 420  # "no module over ~400 lines"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "specrt").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    for path in sorted((ROOT / "export").glob("*.py")):
        stem = path.stem
        found["specrt.export" if stem == "__init__" else f"specrt.export.{stem}"] = path
    return found


def room(module: str) -> str:
    if module in FOUNDATION:
        return "foundation"
    if module in TOP:
        return "top"
    return module.split(".")[1]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The specrt modules `name` imports (resolved relative imports; `from pkg import module` counts as the
    module, `from module import name` as the module)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


GRAPH = {name: imports(name, path, set(modules())) for name, path in modules().items()}


def test_the_walk_sees_the_imports():
    """The walker itself: it must find imports it is known to have, or every check below would pass empty."""
    assert "specrt.runtime.session" in GRAPH["specrt.tuning.measure"]
    assert "specrt.decoding.speculative" in GRAPH["specrt.engine.decide"]
    assert "specrt.runtime.session" in GRAPH["specrt.export.validate"]
    assert "specrt.engine.api" in GRAPH["specrt"]
    assert len(GRAPH) >= 40


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_point_down_the_layers(name):
    mine = room(name)
    if mine == "top":
        return
    wrong = sorted(t for t in GRAPH[name] if room(t) != mine and room(t) not in ALLOWED[mine])
    assert not wrong, f"{name} ({mine}) imports {wrong}; {mine} may import only from {sorted(ALLOWED[mine])}"


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if nxt.startswith(node + ".") or node == "specrt":  # a package importing its own modules
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [])


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_stay_small_and_say_what_they_own(name):
    path = modules()[name]
    lines = path.read_text().count("\n")
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it (at most ~400)"
    tree = ast.parse(path.read_text())
    if name != "specrt.__main__":
        assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} has no docstring saying what it owns"


@pytest.mark.parametrize("package", ["bundle", "runtime", "decoding", "tuning", "engine", "serve", "scale"])
def test_each_room_names_what_it_owns_and_must_not_import(package):
    doc = ast.get_docstring(ast.parse((ROOT / "specrt" / package / "__init__.py").read_text())) or ""
    assert "Owns" in doc or "owns" in doc, doc
    assert "import" in doc.lower(), f"specrt/{package}/__init__.py must say what it may and must not import"

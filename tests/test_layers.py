"""The import graph of ``alacarte/`` against the layers of docs/design.md: no import from a lower
layer to a higher one, no import cycle, every module placed."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "alacarte"


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _layers() -> list[tuple[str, list[str]]]:
    """(layer, the modules and packages it names) from the table under "## Layers", bottom up."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = re.search(r"^## Layers\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    rows = [line.split("|")[1:-1] for line in section.splitlines() if re.match(r"\| \d+ ", line)]
    return [(layer.strip(), re.findall(r"`([\w.]+)`", names)) for layer, names, *_ in rows]


def _layer_of(module: str, layers) -> int | None:
    """The index of the layer naming ``module`` or, nearest first, a package holding it (not ``alacarte``)."""
    candidates = [module] + [module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1)]
    for name in candidates:
        if name == "alacarte" and module != "alacarte":
            break
        for index, (_, named) in enumerate(layers):
            if name in named:
                return index
    return None


def _target(name: str) -> str | None:
    """The package module an imported name refers to: the longest module of the package it starts with."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) of every import in ``path`` — at any nesting, relative or absolute — and
    the packages each import runs on the way that are not ``module``'s own."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # ``from package import name`` imports the module package.name where there is one
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            target = _target(name)
            if target is None:
                continue  # outside the package
            found.append((target, node.lineno))
            parent = target.rpartition(".")[0]
            while parent.count("."):  # (alacarte itself is being imported already)
                if not (module == parent or module.startswith(parent + ".")):
                    found.append((parent, node.lineno))
                parent = parent.rpartition(".")[0]
    return [(target, line) for target, line in found if target != module]


def _graph() -> dict[str, list[tuple[str, int]]]:
    return {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_layer_table_places_every_module_and_names_only_modules_that_exist():
    layers = _layers()
    assert [layer.split()[1] for layer, _ in layers][:3] == ["ops", "features", "kernels"], layers
    unplaced = [module for module in MODULES if _layer_of(module, layers) is None]
    assert not unplaced, f"not in the table of docs/design.md, ## Layers: {unplaced}"
    stale = [name for _, named in layers for name in named if name not in MODULES]
    assert not stale, f"docs/design.md, ## Layers, names modules that do not exist: {stale}"
    named = [name for _, names in layers for name in names]
    assert len(named) == len(set(named)), "a module is in two layers"


def test_no_module_imports_from_a_higher_layer():
    layers = _layers()
    upward = []
    for module, imports in _graph().items():
        own = _layer_of(module, layers)
        for target, line in imports:
            theirs = _layer_of(target, layers)
            if theirs > own:
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({layers[own][0]}) imports "
                              f"{target} ({layers[theirs][0]})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def _cycle(graph: dict[str, list[tuple[str, int]]]) -> list[tuple[str, str, int]] | None:
    """One import cycle as its edges (importer, imported, line), or ``None``."""
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        for target, line in graph.get(module, []):
            stack.append((module, target, line))
            if state.get(target) == "open":
                start = next(i for i, (importer, _, _) in enumerate(stack) if importer == target)
                return stack[start:]
            if target not in state and (found := visit(target)):
                return found
            stack.pop()
        state[module] = "done"
        return None

    for module in graph:
        if module not in state and (found := visit(module)):
            return found
    return None


def test_there_is_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle:\n" + "\n".join(
        f"{MODULES[importer].relative_to(ROOT)}:{line}: {importer} imports {target}" for importer, target, line in cycle)


@pytest.mark.parametrize("source, target", [
    ("from ..selection.simplex import project_to_simplex\n", "alacarte.selection.simplex"),
    ("def f():\n    from alacarte import cli\n", "alacarte.cli"),
    ("import alacarte.bench.runner as runner\n", "alacarte.bench.runner"),
])
def test_imports_are_found_however_they_are_written(tmp_path, source, target):
    """A function-local, relative or absolute import of a module is an edge to it (and to its packages)."""
    path = tmp_path / "base.py"
    path.write_text(source)
    imports = [name for name, _ in _imports("alacarte.kernels.base", path)]
    assert target in imports
    assert _layer_of("alacarte.kernels.base", _layers()) < _layer_of(target, _layers())


def test_a_cycle_is_reported_with_its_edges():
    graph = {"a": [("b", 1)], "b": [("c", 2)], "c": [("a", 3)], "d": [("a", 4)]}
    assert _cycle(graph) == [("a", "b", 1), ("b", "c", 2), ("c", "a", 3)]
    assert _cycle({"a": [("b", 1)], "b": []}) is None

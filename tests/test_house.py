"""House rules on the code's shape: modules and the core's functions stay short enough to read, and
no module reaches into another's private names."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "alacarte"
MODULE_LINES = 600
FUNCTION_LINES = 80
# The model, its features and its training: the code every fit runs.
CORE = ["ops", "features", "kernels", "woodbury.py", "mll.py", "models.py", "_standardized.py", "exact.py",
        "training", "streaming.py", "_chunks.py"]
EXEMPT: set[str] = set()  # files held to none of the rules


def _modules(parts) -> list[Path]:
    found = []
    for part in parts:
        path = PACKAGE / part
        assert path.exists(), f"{path} is gone: update CORE"
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else str(path)


def long_modules(paths, limit: int = MODULE_LINES) -> list[str]:
    """``path: lines`` of each module over ``limit`` lines."""
    counts = {path: len(path.read_text().splitlines()) for path in paths}
    return [f"{_name(path)}: {n}" for path, n in counts.items() if n > limit]


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from its signature to its end, less its docstring: the code a reader follows."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def long_functions(paths, limit: int = FUNCTION_LINES) -> list[str]:
    """``path:line name: lines`` of each function or method over ``limit`` lines (:func:`body_lines`)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > limit:
                found.append(f"{_name(path)}:{node.lineno} {node.name}: {body_lines(node)}")
    return found


def test_no_module_is_over_600_lines():
    assert not long_modules(p for p in PACKAGE.rglob("*.py") if p.relative_to(ROOT).as_posix() not in EXEMPT)


def test_no_core_function_is_over_80_lines():
    assert not long_functions(_modules(CORE))


def test_the_limits_can_fail(tmp_path):
    source = tmp_path / "long.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES - 1))  # and the signature
    source.write_text('def f():\n    """A docstring, not counted."""\n' + body + "\n" * (MODULE_LINES - FUNCTION_LINES))
    assert long_functions([source], limit=FUNCTION_LINES) == []  # exactly at the limit
    assert len(long_functions([source], limit=FUNCTION_LINES - 1)) == 1
    assert len(long_modules([source], limit=MODULE_LINES)) == 1


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def private_imports(path: Path, text: str | None = None) -> list[str]:
    """``path:line module.name`` of each ``_private`` name of another alacarte module that ``path``
    imports (``from module import _name``) or reads (``module._name`` of an imported module).  A private
    module (``alacarte._validation``) may be imported: its names are private to the package, not to it.
    ``text``: the module's source, if not the file's."""
    tree = ast.parse(path.read_text() if text is None else text)
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    modules, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            if not base.startswith("alacarte"):
                continue
            for alias in node.names:
                if _is_module(f"{base}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {base}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("alacarte") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and not _is_module(f"{modules[node.value.id]}.{node.attr}")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    paths = [p for folder in ("alacarte", "experiments") for p in sorted((ROOT / folder).rglob("*.py"))
             if p.relative_to(ROOT).as_posix() not in EXEMPT]
    assert not [hit for path in paths for hit in private_imports(path)]


def test_private_imports_are_found():
    source = ("from .streaming import ChunkedData, _hidden\nimport alacarte.training._stages as stages\n"
              "from . import _chunks\nstages._hidden\n_chunks.RowTally\n")
    assert private_imports(PACKAGE / "probe.py", source) == ["alacarte/probe.py:1 alacarte.streaming._hidden",
                                                             "alacarte/probe.py:4 alacarte.training._stages._hidden"]

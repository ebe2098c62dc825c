"""The public surface: what ``alacarte`` exports, each module's ``__all__``, annotated signatures."""
import importlib
import inspect
import pkgutil

import pytest

import alacarte

MODULES = [name for _, name, _ in pkgutil.walk_packages(alacarte.__path__, "alacarte.")
           if not any(part.startswith("_") for part in name.split("."))]

# Data arguments take tensors, arrays, memory-mapped arrays or iterables of chunks: no one type says it.
DATA = {"x", "X", "y", "train_x", "train_y"}


def _callables(cls):
    yield cls.__name__, cls
    for name, value in vars(cls).items():
        function = getattr(value, "__func__", value)
        if not name.startswith("_") and inspect.isfunction(function):
            yield f"{cls.__name__}.{name}", function


@pytest.mark.parametrize("module", MODULES)
def test_all_lists_only_names_the_module_has(module):
    """Every public module that defines anything says what it exports (without ``__all__``, ``import *``
    takes a module's imports too), and only names it has."""
    module = importlib.import_module(module)
    defined = [name for name, value in vars(module).items()
               if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__]
    assert hasattr(module, "__all__") or not defined
    missing = [name for name in getattr(module, "__all__", ()) if not hasattr(module, name)]
    assert not missing


def test_public_classes_annotate_their_arguments():
    """Every argument of the exported classes' constructors and public methods, and of the plotting
    and training functions, has a type hint, and every such method or function a return hint
    (random_state, ExactRBFGP's likelihood, WoodburyMarginalLogLikelihood's model, plot_spectrum's
    ax and input_scale included)."""
    import alacarte.plotting
    import alacarte.training

    callables = [item for name in alacarte.__all__ if inspect.isclass(getattr(alacarte, name))
                 for item in _callables(getattr(alacarte, name))]
    for module in (alacarte.plotting, alacarte.training):
        callables += [(name, getattr(module, name)) for name in module.__all__
                      if inspect.isfunction(getattr(module, name))]
    unannotated = []
    for qualname, function in callables:
        signature = inspect.signature(function)
        unannotated += [f"{qualname}({p.name})" for p in signature.parameters.values()
                        if p.annotation is inspect.Parameter.empty and p.name not in DATA | {"self"}
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if inspect.isfunction(function) and signature.return_annotation is inspect.Signature.empty:
            unannotated.append(f"{qualname} -> ?")
    assert not unannotated


def _public_names() -> list[tuple[str, object]]:
    """(``module.name``, object) of every name in the package's and its public modules' ``__all__``."""
    return [(f"{module}.{name}", getattr(importlib.import_module(module), name))
            for module in ["alacarte", *MODULES] for name in getattr(importlib.import_module(module), "__all__", ())]


def _resolve(name: str):
    """The object ``name`` (``package.module.attribute``) refers to."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def _undocumented(documented: list[str]) -> list[str]:
    """The public names none of ``documented`` (full names) refers to: a class or function by identity
    (``alacarte.kernels.FeatureKernel`` is ``alacarte.FeatureKernel``), a constant by name and value."""
    pages = [(name.rsplit(".", 1)[-1], _resolve(name)) for name in documented]
    ids = {id(obj) for _, obj in pages}

    def found(name, obj):
        if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
            return id(obj) in ids
        return any(short == name.rsplit(".", 1)[-1] and value is obj for short, value in pages)

    return [name for name, obj in _public_names() if not found(name, obj)]


def test_every_public_name_has_an_api_reference_entry():
    """Every name in an ``__all__`` is documented in docs/api.rst (the command line and benchmark
    functions, ``marginal_log_likelihood``, ``SimplexStep``, ``UCI_NUM_SPLITS`` too), by an
    ``autoclass``/``autofunction``/``autodata`` of it or an ``automodule`` whose members include it; and
    each such entry, and each method an ``autoclass`` lists, has a docstring (or, for a constant, a
    ``#:`` comment), without which autodoc drops it from the page without a word (a method listed
    and missing from the page)."""
    import re
    from pathlib import Path

    analyzer = pytest.importorskip("sphinx.pycode").ModuleAnalyzer
    text = (Path(__file__).resolve().parents[1] / "docs" / "api.rst").read_text()
    documented = []
    for match in re.finditer(r"^\.\. auto(\w+):: (\S+)\n((?:[ \t]+:.*\n(?:[ \t]{6,}\S.*\n)*)*)", text, re.M):
        kind, name, options = match.groups()
        if kind != "module":
            documented.append(name)
            if kind == "class":  # a listed method without a docstring is left off the page too
                members = re.search(r":members:(.*(?:\n[ \t]{6,}\S.*)*)", options)
                cls = _resolve(name)
                for member in [m.strip() for m in members.group(1).split(",") if m.strip()] if members else []:
                    assert inspect.getdoc(getattr(cls, member)), \
                        f"{name}.{member} has no docstring: autodoc would leave it out of the page"
            continue
        members = re.search(r":members:(.*(?:\n[ \t]{6,}\S.*)*)", options)
        listed = [m.strip() for m in members.group(1).split(",") if m.strip()] if members else []
        module = importlib.import_module(name)
        attr_docs = analyzer.for_module(name).find_attr_docs()
        for member in listed or (module.__all__ if members else []):
            value = getattr(module, member)
            has_doc = (inspect.getdoc(value) if inspect.isclass(value) or inspect.isroutine(value)
                       else ("", member) in attr_docs)
            assert has_doc, f"{name}.{member} has no docstring: autodoc would leave it out of the page"
            documented.append(f"{name}.{member}")
    assert documented
    missing = _undocumented(documented)
    assert not missing, f"in an __all__ but not in docs/api.rst: {missing}"


@pytest.mark.slow
def test_docs_build_with_warnings_as_errors_and_no_private_bases(tmp_path):
    """``sphinx -W`` builds the docs (an unquoted ``|loss|`` in a docstring stops it), and no "Bases:"
    line names a private class (such as _StandardizedGP or _RFFNetBase, classes without a page)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(root / "docs"),
                           str(tmp_path)], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "api.html").read_text()
    bases = re.findall(r"Bases: (.*?)</p>", page, re.S)
    assert bases and not [b for b in bases if re.search(r">_[A-Za-z]", b)]
    # Fitted attributes keep their trailing underscore on the page: napoleon's field name ``model_``
    # can be read as a hyperlink reference, and AlaCarteRegressor's page would list model, history, n_iter …
    fitted = {name for cls in (alacarte.AlaCarteRegressor, alacarte.SRFFRegressor)
              for name in re.findall(r"^ {8}(\w+_):", cls.__doc__, re.M)}
    assert {"model_", "history_", "output_weights_"} <= fitted
    assert not [name for name in fitted if f"<strong>{name}</strong>" not in page]
    # What the build wrote, not what api.rst asks for: every public name made it onto a page.
    from sphinx.util.inventory import InventoryFile

    with open(tmp_path / "objects.inv", "rb") as fh:
        inventory = InventoryFile.load(fh, "", lambda base, uri: uri)
    built = [name for kind, entries in inventory.items() if kind.startswith("py:") and kind != "py:module"
             for name in entries]
    assert not _undocumented(built)


def test_public_surface_is_small():
    assert set(alacarte.__all__) == {
        "FeatureKernel", "FastfoodRBFKernel", "FSARDKernel", "FSGBARDKernel", "RandomFourierKernel",
        "SSGPRKernel", "SpectralMixtureFastfoodKernel", "PiecewiseLinearRadialKernel", "FeatureGP", "ExactRBFGP",
        "WoodburyMarginalLogLikelihood", "fit", "fit_pilot", "AlaCarteRegressor", "list_uci", "load_uci",
        "SRFFRegressor", "RFFNetRegressor", "RFFNetClassifier", "DerivativeSelector",
    }

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
    """Every public module that defines anything says what it exports (alacarte.cli and
    alacarte.ops.autograd did not: ``import *`` took their imports too), and only names it has."""
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
    ax and input_scale had none; nor had FeatureKernel.forward or plot_relevance a return hint)."""
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


@pytest.mark.slow
def test_docs_build_with_warnings_as_errors_and_no_private_bases(tmp_path):
    """``sphinx -W`` builds the docs (fit's ``|loss|`` once stopped it), and no "Bases:" line names
    a private class (ExactRBFGP, FeatureGP and the RFFNet estimators showed _StandardizedGP and
    _RFFNetBase, classes without a page)."""
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
    bases = re.findall(r"Bases: (.*?)</p>", (tmp_path / "api.html").read_text(), re.S)
    assert bases and not [b for b in bases if re.search(r">_[A-Za-z]", b)]

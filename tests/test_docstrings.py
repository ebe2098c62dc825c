"""Every ``>>>`` example in the package's docstrings runs as written and prints what it shows."""
import doctest
import importlib
import io
import os
import pkgutil
import warnings
from pathlib import Path

import pytest

import alacarte

SHARED = Path(__file__).resolve().parents[2] / "shared" / "uci"

# alacarte.__main__ runs the command line when imported; it has no docstring examples.
MODULES = [name for _, name, _ in pkgutil.walk_packages(alacarte.__path__, "alacarte.") if name != "alacarte.__main__"]


def _examples() -> list:
    examples = []
    for name in ["alacarte", *MODULES]:
        module = importlib.import_module(name)
        # An empty namespace, not the module's: each example imports what it uses, so a reader can run it.
        for test in doctest.DocTestFinder().find(module, name, globs={}):
            if test.examples:
                examples.append(pytest.param(test, id=test.name))
    return examples


@pytest.mark.parametrize("test", _examples())
def test_docstring_example(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything an example writes lands here
    if "load_uci" in test.docstring:
        data = os.environ.get("ALACARTE_DATA") or str(SHARED)   # empty means unset, as for load_uci
        if not Path(data).is_dir():
            pytest.skip(f"the UCI data folder {data} is not present")
        monkeypatch.setenv("ALACARTE_DATA", data)
    report = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    # An example that warns (noise at its bound, jitter added) shows the reader a fit gone wrong.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


def _rendered_docstrings() -> list:
    """(name, docstring) of every module, class, function, method and property of the package."""
    import inspect

    found = {}
    for name in ["alacarte", *MODULES]:
        module = importlib.import_module(name)
        found[name] = module.__doc__
        for attr, obj in vars(module).items():
            if getattr(obj, "__module__", None) != name or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            found[f"{name}.{attr}"] = obj.__doc__
            for member, value in vars(obj).items() if inspect.isclass(obj) else ():
                function = getattr(getattr(value, "__func__", value), "fget", getattr(value, "__func__", value))
                if callable(function):
                    found[f"{name}.{attr}.{member}"] = function.__doc__
    return [(name, doc) for name, doc in found.items() if doc]


def test_docstrings_are_valid_restructuredtext():
    """docs/api.rst renders the docstrings with napoleon and ``sphinx -W``: a reStructuredText error in
    one (``|loss|`` read as an undefined substitution, say) fails the whole docs build.
    Each docstring goes through napoleon and docutils here, Sphinx's roles read as literals; warnings
    count too (an unquoted ``(*batch, M)`` shape opens an emphasis)."""
    import inspect

    docutils = pytest.importorskip("docutils.core")
    napoleon = pytest.importorskip("sphinx.ext.napoleon")
    from docutils import nodes
    from docutils.parsers.rst import roles
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    def literal(name, rawtext, text, lineno, inliner, options=None, content=None):
        return [nodes.literal(rawtext, text)], []

    for role in ("class", "func", "meth", "mod", "attr", "data", "exc", "obj", "math", "ref", "doc"):
        roles.register_local_role(role, literal)
    config = napoleon.Config(napoleon_use_ivar=True, strip_signature_backslash=True)  # ivar model_ as Sphinx reads it
    errors = []
    for name, doc in _rendered_docstrings():
        text = "\n".join(GoogleDocstring(inspect.cleandoc(doc), config).lines())
        # Messages of transforms (an undefined substitution) reach the stream, not always the tree.
        stream = io.StringIO()
        docutils.publish_doctree(text, settings_overrides={"report_level": 2, "halt_level": 5,
                                                           "warning_stream": stream})  # warnings fail -W too
        errors += [f"{name}: {line}" for line in stream.getvalue().splitlines() if line.strip()]
    assert not errors, "\n".join(errors)

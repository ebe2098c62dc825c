"""Every ``>>>`` example in the package's docstrings runs as written and prints what it shows."""
import doctest
import importlib
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

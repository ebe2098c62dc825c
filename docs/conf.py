"""Sphinx configuration: MyST Markdown pages, API reference from the docstrings.

Build (CI does this with warnings as errors)::

    pip install -e ".[docs]" && python -m sphinx -W -b html docs docs/_build/html
"""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import alacarte  # noqa: E402

project = "alacarte"
author = "the alacarte authors"
release = alacarte.__version__
copyright = "the alacarte authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
# Napoleon writes an attribute ``model_`` as ``model\_`` only with this set; otherwise the field name
# ``model_`` is read as a hyperlink reference and the page shows ``model`` (``reg.model`` does not exist).
strip_signature_backslash = True

html_theme = "alabaster"
html_static_path = []


def _private(cls: type) -> bool:
    """A class named ``_…`` or defined in a module named ``_…``: it has no page."""
    return any(part.startswith("_") for part in [*cls.__module__.split("."), cls.__name__])


def _public_bases(app, name, obj, options, bases):
    """Show a private base class (``StandardizedGP`` of ``alacarte._standardized``, ``_RFFNetBase``) as its
    first public ancestor: the private one has no page, so "Bases:" would name a class the reader cannot look up."""
    for i, base in enumerate(bases):
        while isinstance(base, type) and _private(base) and base.__bases__:
            base = base.__bases__[0]
        bases[i] = base


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)

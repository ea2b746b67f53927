"""Sphinx configuration of gnnpipe's API reference (built by tests/docs/test_api_reference.py with -W)."""

project = "gnnpipe"
author = "gnnpipe contributors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
suppress_warnings = []

# Every cross-reference must resolve (with -W a broken one fails the build). There is no network for
# intersphinx, so references to other libraries' types (base classes shown by autodoc, types named in
# docstrings) are ignored by pattern; references to gnnpipe objects are never ignored.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|torch_geometric|numpy|scipy|ase|attrs?)(\..+)?"),
    (r"py:.*", r"(abc|collections|enum|pathlib|typing|builtins|dataclasses)(\..+)?"),
]

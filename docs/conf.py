"""Sphinx configuration: API reference (autodoc + napoleon), method notes and tutorials.

Build with ``make docs`` (HTML in ``docs/_build/html``); ``tests/test_docs.py`` runs the same build
with warnings as errors. Nothing here reaches the network: no intersphinx, and the tutorials are
rendered from the outputs stored in the notebooks (myst-nb, execution off).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

import pyro_invariance

DOCS = Path(__file__).resolve().parent

project = "pyro_invariance"
author = "pyro_invariance developers"
copyright = "pyro_invariance developers"  # noqa: A001
release = pyro_invariance.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",  # Markdown (MyST) pages and .ipynb notebooks
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "jupyter_execute", "**/.ipynb_checkpoints"]

# Notebooks are shown with the outputs stored in them, never executed: the tutorials take
# minutes and tests/test_tutorials.py runs them.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# Google-style docstrings (Args:, Returns:, Raises:, Attributes:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = [("Class attributes", "Attributes")]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_preserve_defaults = True
# A method without a docstring shows none (not torch's ``Module.forward`` text).
autodoc_inherit_docstrings = False

# Every cross-reference must resolve (see ``_resolve_existing`` below for what counts).
nitpicky = True

html_theme = "alabaster"
html_title = f"pyro_invariance {release}"
html_static_path: list[str] = []


# ---------------------------------------------------------------------------------------------
# ``.. api-module:: NAME``: documents a module, or a package and every module below it, found by
# walking the package at build time. Pages therefore name only the packages; a module that is
# added, moved or renamed inside one appears without editing the docs.
#
# ``.. api-module:: pyro_invariance`` with ``:rest:`` documents the package's own docstring and
# every top-level module that no other page under docs/api/ names.
# ---------------------------------------------------------------------------------------------

_API_DIRECTIVE = re.compile(r"^\.\. api-module::\s+(\S+)\s*$", re.MULTILINE)


def _is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _is_package(name: str) -> bool:
    return hasattr(importlib.import_module(name), "__path__")


def _modules_below(name: str) -> list[str]:
    """``name`` and, if it is a package, its public submodules at every depth, sorted."""
    module = importlib.import_module(name)
    below = []
    if hasattr(module, "__path__"):
        below = [info.name for info in pkgutil.walk_packages(module.__path__, prefix=name + ".")]
    return [name] + sorted(n for n in set(below) if _is_public(n))


def _named_on_pages() -> set[str]:
    """Modules that an ``api-module`` directive in docs/api/*.rst names explicitly."""
    named: set[str] = set()
    for page in sorted((DOCS / "api").glob("*.rst")):
        named.update(_API_DIRECTIVE.findall(page.read_text(encoding="utf-8")))
    return named


class ApiModule(SphinxDirective):
    required_arguments = 1
    option_spec = {"rest": directives.flag}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        try:
            if "rest" in self.options:
                # the top-level modules and subpackages that no other page names, with all below them
                skip = _named_on_pages() - {name}
                top = importlib.import_module(name).__path__
                tops = (info.name for info in pkgutil.iter_modules(top, prefix=name + "."))
                below = [m for t in sorted(tops) if t not in skip and _is_public(t) for m in _modules_below(t)]
            else:
                below = _modules_below(name)[1:]
            # The page's own module: its docstring, and its members unless it is a package (a
            # package's members are documented in their modules; re-exports would appear twice).
            lines = [f".. automodule:: {name}", "   :no-members:" if _is_package(name) else "", ""]
            for mod in below:
                lines += [mod, "-" * len(mod), "", f".. automodule:: {mod}"]
                lines += ["   :no-members:" if _is_package(mod) else "", ""]
        except ImportError as exc:
            raise self.error(f"api-module: cannot import {name!r}: {exc}") from exc
        node = nodes.section()
        nested_parse_with_titles(self.state, StringList(lines, source=f"<api-module {name}>"), node)
        return node.children


# ---------------------------------------------------------------------------------------------
# Cross-references. With ``nitpicky`` Sphinx warns about every Python reference it cannot link.
# Many of ours name a real object that has no entry of its own in these pages: a re-export
# (``pyro_invariance.fit`` is documented as ``pyro_invariance.infer.training.fit``), a name
# imported into the current module (``Tensor``), a private helper, or another library (torch,
# Pyro, NumPy: no intersphinx, since the build runs offline). Those resolve here: to the
# documented object when there is one, otherwise to plain text. What is left -- a name that
# imports as nothing -- is a broken reference and fails the build.
# ---------------------------------------------------------------------------------------------

_MISSING = object()


def _import_dotted(dotted: str):
    """The object that ``dotted`` names (longest importable module prefix, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001  (not a module: try a shorter prefix)
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


@functools.cache
def _source_imports(module_name: str) -> dict[str, str]:
    """``{local name: dotted name}`` for every ``from X import Y`` in a module's source, including
    those under ``if TYPE_CHECKING:`` that never run (annotations such as ``-> Figure``)."""
    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except Exception:  # noqa: BLE001
        return {}
    found = {}
    for stmt in ast.walk(ast.parse(source)):
        if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
            for alias in stmt.names:
                found[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
    return found


def _bare(target: str) -> str:
    """``~.name`` / ``'Name'`` (a string annotation) -> ``name`` / ``Name``."""
    return target.strip("'\"").lstrip("~.")


def _candidates(node, target: str) -> list[str]:
    target = _bare(target)
    module, cls = node.get("py:module"), node.get("py:class")
    names = []
    if module and target.split(".")[0] in _source_imports(module):
        head, _, rest = target.partition(".")
        names.append(_source_imports(module)[head] + (f".{rest}" if rest else ""))
    if module and cls:
        names.append(f"{module}.{cls}.{target}")
    if module:
        names.append(f"{module}.{target}")
        if "." in module:  # a sibling in the same package (``:mod:`.images```, ``:func:`fit```)
            names.append(f"{module.rsplit('.', 1)[0]}.{target}")
    names.append(target)
    return names


def _resolve_existing(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    for name in _candidates(node, node["reftarget"]):
        obj = _import_dotted(name)
        if obj is _MISSING:
            continue
        module = getattr(obj, "__module__", None) if not isinstance(obj, type(importlib)) else None
        qualname = getattr(obj, "__qualname__", None)
        canonical = obj.__name__ if isinstance(obj, type(importlib)) else (
            f"{module}.{qualname}" if module and qualname else None)
        for full in (canonical, name):
            if full and full in domain.objects:
                return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", full, node, contnode)
        return contnode  # a real object without a page here: plain text
    # A short name (``MatrixNormal``, ``InvariantMLP.filter_bank``) that ends exactly one
    # documented name, as Sphinx itself does for ``:class:`.MatrixNormal```.
    suffix = "." + _bare(node["reftarget"])
    matches = [name for name in domain.objects if name.endswith(suffix)]
    if len(matches) == 1:
        return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", matches[0], node, contnode)
    return None


def _napoleon_without_inline_types(app) -> None:
    """Napoleon reads ``#: Label: text`` above a constant as a type ``Label`` and a description;
    ours carry their types as annotations, so data and attribute docstrings skip napoleon."""
    from sphinx.ext import napoleon

    for listener in list(app.events.listeners.get("autodoc-process-docstring", [])):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)

            def process(app, what, name, obj, options, lines, _napoleon=listener.handler):
                if what not in ("data", "attribute"):
                    _napoleon(app, what, name, obj, options, lines)

            app.connect("autodoc-process-docstring", process, priority=listener.priority)


def setup(app):  # noqa: D103
    app.add_directive("api-module", ApiModule)
    app.connect("missing-reference", _resolve_existing)
    _napoleon_without_inline_types(app)
    return {"parallel_read_safe": True}

"""Sphinx configuration: API reference (autodoc + autosummary + napoleon), method notes and tutorials.

Build with ``make docs`` (HTML in ``docs/_build/html``); ``tests/test_docs.py`` runs the same build
with warnings as errors. Nothing here reaches the network: no intersphinx, MathJax is served from
the build's own ``_static`` folder, and the tutorials are rendered from the outputs stored in the
notebooks (myst-nb, execution off).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
import shutil
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.ext.autosummary import import_by_name
from sphinx.ext.autosummary.generate import (
    AutosummaryRenderer,
    generate_autosummary_content,
    generate_autosummary_docs,
)
from sphinx.transforms import SphinxTransform
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
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 copied into _static/mathjax: formulas render offline
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "sphinxarg.ext",  # the command-line page is generated from the argument parser
    "myst_nb",  # Markdown (MyST) pages and .ipynb notebooks
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "jupyter_execute", "**/.ipynb_checkpoints"]
templates_path = ["_templates"]

# Notebooks are shown with the outputs stored in them, never executed: the tutorials take
# minutes and tests/test_tutorials.py runs them.
nb_execution_mode = "off"
nb_merge_streams = True
# ``text/markdown`` outputs (the comparison tables) are parsed as MyST, so pipe tables render as
# tables; CommonMark, myst-nb's default, has no tables.
nb_render_markdown_format = "myst"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# Google-style docstrings (Args:, Returns:, Raises:, Attributes:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = [("Class attributes", "Attributes"), ("Instance attributes", "Attributes")]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_preserve_defaults = True
# A method without a docstring shows none (not torch's ``Module.forward`` text).
autodoc_inherit_docstrings = False

# One page per public object: ``_generate_api_stubs`` below writes the stubs (from the templates
# in _templates/autosummary/) into api/generated/ when the build starts.
autosummary_generate = False
autosummary_ignore_module_all = True

# Every cross-reference must resolve (see ``_resolve_existing`` below for what counts).
nitpicky = True

html_theme = "furo"
html_title = f"pyro_invariance {release}"
html_static_path: list[str] = []

# The copy button leaves out prompts and the output of shell and Python sessions.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True


# ---------------------------------------------------------------------------------------------
# The API pages. ``.. api-module:: NAME`` on a page under docs/api/ renders
#
# - for a package: its docstring and a table of every public module below it (found by walking
#   the package at build time, so a module that is added, moved or renamed appears without
#   editing the docs), each row linking to the module's page;
# - for a module: its docstring and tables of its classes, functions and documented constants.
#
# With ``:rest:`` (``.. api-module:: pyro_invariance``) the table lists the top-level modules and
# subpackages that no other page names, and the package's top-level names follow.
#
# A module's page and every public object's page are stubs rendered from the templates in
# _templates/autosummary/ into api/generated/ when the build starts (``_generate_api_stubs``).
# ---------------------------------------------------------------------------------------------

_API_DIRECTIVE = re.compile(r"^\.\. api-module::\s+(\S+)[ \t]*\n((?:[ \t]+:\w+:.*\n?)*)", re.MULTILINE)
# modules a page documents by hand (the command line's page)
_AUTOMODULE = re.compile(r"^\.\. automodule::\s+(\S+)\s*$", re.MULTILINE)
GENERATED = DOCS / "api" / "generated"


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


def _page_directives() -> list[tuple[str, bool]]:
    """``(module, rest)`` for every ``api-module`` directive in docs/api/*.rst."""
    found = []
    for page in sorted((DOCS / "api").glob("*.rst")):
        for name, options in _API_DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            found.append((name, ":rest:" in options))
    return found


def _named_on_pages() -> set[str]:
    """Modules that a page under docs/api/ names explicitly (``api-module`` or ``automodule``)."""
    named = {name for name, _ in _page_directives()}
    for page in sorted((DOCS / "api").glob("*.rst")):
        named.update(_AUTOMODULE.findall(page.read_text(encoding="utf-8")))
    return named


def _table(title: str, names: list[str], toctree: bool) -> list[str]:
    """A section ``title`` holding an autosummary table of ``names`` (relative to the current
    module); ``toctree``: the rows' pages (module stubs) belong to the navigation tree."""
    if not names:
        return []
    head = [title, "-" * len(title), "", ".. autosummary::", "   :nosignatures:"]
    return head + (["   :toctree: generated"] if toctree else []) + [""] + [f"   {n}" for n in names] + [""]


def _module_rst(name: str, **context) -> str:
    """A module's docstring and member tables, from _templates/autosummary/module.rst."""
    app = _APP[0]
    full, obj, parent, modname = import_by_name(name)
    return generate_autosummary_content(
        full,
        obj,
        parent,
        AutosummaryRenderer(app),
        template_name="module",
        imported_members=False,
        recursive=False,
        context={**app.config.autosummary_context, **context},
        modname=modname,
        qualname=full.removeprefix(modname + "."),
        config=app.config,
        events=app.events,
    )


def _table_modules(name: str, rest: bool) -> list[str]:
    """The modules that the page of ``.. api-module:: name`` lists (none for a plain module)."""
    if rest:
        skip = _named_on_pages() - {name}
        package = importlib.import_module(name)
        tops = sorted(info.name for info in pkgutil.iter_modules(package.__path__, prefix=name + "."))
        return [m for t in tops if t not in skip and _is_public(t) for m in _modules_below(t)]
    return _modules_below(name)[1:] if _is_package(name) else []


def _api_rst(name: str, rest: bool) -> list[str]:
    """The reStructuredText that ``.. api-module:: name`` stands for."""
    lines = [*_module_rst(name, embedded=True).splitlines(), ""]  # the docstring, the members defined here
    below = [m.removeprefix(name + ".") for m in _table_modules(name, rest)]
    lines += _table("Modules", below, toctree=True)
    if rest:  # the names a user reaches as ``pyro_invariance.fit``: links to where they are defined
        package = importlib.import_module(name)
        exported = [n for n in getattr(package, "__all__", []) if not inspect.ismodule(getattr(package, n))]
        lines += _table("Top-level names", exported, toctree=False)
    return lines


class ApiModule(SphinxDirective):
    required_arguments = 1
    option_spec = {"rest": directives.flag}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        try:
            lines = _api_rst(name, "rest" in self.options)
        except ImportError as exc:
            raise self.error(f"api-module: cannot import {name!r}: {exc}") from exc
        node = nodes.section()
        nested_parse_with_titles(self.state, StringList(lines, source=f"<api-module {name}>"), node)
        return node.children


_APP: list = []  # the running application, for ``_module_rst``


def _generate_api_stubs(app) -> None:
    """Write api/generated/: a page per module in the pages' tables and per public object.

    Module pages belong to the navigation tree; object pages are orphans reached from their
    module's table (a sidebar listing hundreds of objects on every page is slow to build and to
    read). The folder is rebuilt from scratch, so a module or object that no longer exists
    leaves no stale page behind.
    """
    shutil.rmtree(GENERATED, ignore_errors=True)
    GENERATED.mkdir(parents=True)
    # Autosummary writes a stub for each row of a table with ``:toctree:``: the pages' module
    # tables, and every module's member tables rendered with ``toctree`` on.
    lines = []
    for name, rest in _page_directives():
        lines += _api_rst(name, rest)
        for module in [name, *_table_modules(name, rest)]:
            lines += _module_rst(module, embedded=True, toctree=True).splitlines()
    seed = GENERATED / "_tables.txt"  # not a source file (Sphinx reads .rst, .md, .ipynb only)
    seed.write_text("\n".join(lines), encoding="utf-8")
    generate_autosummary_docs([str(seed)], output_dir=GENERATED, app=app, suffix=".rst", overwrite=True)
    seed.unlink()


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
        canonical = (
            obj.__name__
            if isinstance(obj, type(importlib))
            else (f"{module}.{qualname}" if module and qualname else None)
        )
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


def _viewcode_module(app, modname: str, fullname: str) -> str | None:
    """The module whose source a documented object links to: for a value (a path, a type alias)
    the module that defines it, not the module of its type (``builtins`` has no source page)."""
    obj = _import_dotted(f"{modname}.{fullname}")
    if obj is _MISSING or inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
        return None  # viewcode's own rule: where the class or function is defined
    return modname


class _OptionsAsLiterals(SphinxTransform):
    """Command-line options in running text (``--resume`` in an argparse help string) become
    literals before SmartQuotes runs: it would print ``--`` as an en dash, and a copied command
    would fail. A ``--`` between words (a dash) is left to SmartQuotes."""

    default_priority = 740  # SmartQuotes: 750
    OPTION = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
    VERBATIM = (nodes.literal, nodes.FixedTextElement, nodes.math, nodes.raw, nodes.comment, nodes.Invisible)

    def apply(self, **kwargs) -> None:
        for text in list(self.document.findall(nodes.Text)):
            if not self.OPTION.search(text) or any(isinstance(a, self.VERBATIM) for a in _ancestors(text)):
                continue
            pieces = self.OPTION.split(str(text))
            text.parent.replace(
                text, [nodes.literal(p, p) if i % 2 else nodes.Text(p) for i, p in enumerate(pieces) if p]
            )


def _ancestors(node):
    while node.parent is not None:
        node = node.parent
        yield node


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
    _APP[:] = [app]
    app.add_directive("api-module", ApiModule)
    app.connect("builder-inited", _generate_api_stubs, priority=400)
    app.connect("missing-reference", _resolve_existing)
    app.add_transform(_OptionsAsLiterals)
    app.connect("viewcode-follow-imported", _viewcode_module)
    _napoleon_without_inline_types(app)
    return {"parallel_read_safe": True}

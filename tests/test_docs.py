"""The Sphinx documentation builds with warnings as errors (the same build as `make docs`), offline,
and reads as rendered text rather than as markup.

Every docstring is rendered here, so bad reStructuredText or a cross-reference to a name that
does not exist fails the build (conf.py sets ``nitpicky``; see ``_resolve_existing`` there). The
built HTML is then read back: every internal link and anchor exists, no page shows a raw
Markdown table or a raw math delimiter, MathJax is served from the build itself, and command
lines keep their ``--``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("myst_nb", reason="the docs extra is not installed (pip install -e '.[docs]')")
bs4 = pytest.importorskip("bs4", reason="the docs extra is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]

# Text a reader should never see outside code: a Markdown table's rule row (``|---|``: a
# ``text/markdown`` output rendered as CommonMark), a TeX delimiter that MathJax did not typeset, and a command-line
# option whose ``--`` was typeset as an en dash.
RAW_MARKUP = {
    "a Markdown table rule": re.compile(r"\|\s*:?[-—–]+:?\s*\|"),  # (SmartQuotes makes --- an em dash)
    "a raw math delimiter": re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$"),
    "an option with an en dash": re.compile(r"(?<!\S)–[a-z]"),
}
_HREF = re.compile(r"""\bhref="([^"]*)\"""")
_ID = re.compile(r"""\bid="([^"]*)\"""")


def _all_modules() -> list[str]:
    package = importlib.import_module("pyro_invariance")
    names = ["pyro_invariance"]
    for info in pkgutil.walk_packages(package.__path__, prefix="pyro_invariance."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("docs")
    out = tmp / "html"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "html",
        "-d",
        str(tmp / "doctrees"),
        str(ROOT / "docs"),
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx-build failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return out


def _pages(html: Path) -> list[Path]:
    """The rendered pages (not the highlighted sources under _modules/ nor the theme's files)."""
    return [p for p in sorted(html.rglob("*.html")) if p.relative_to(html).parts[0] not in ("_modules", "_static")]


def _prose(page: Path) -> str:
    """A page's main text without code, literal blocks and typeset math."""
    soup = bs4.BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    main = soup.find("article") or soup
    for tag in main.find_all(["pre", "code", "script", "style"]):
        tag.decompose()
    for tag in main.find_all(class_=["math", "highlight", "sig"]):
        tag.decompose()
    return main.get_text(" ")


def test_docs_build_without_warnings(html):
    for page in ("index", "methods", "tutorials", "api/index", "api/cli"):
        assert (html / f"{page}.html").is_file(), page
    rendered = sorted(p.stem for p in (html / "tutorials").glob("*.html"))
    notebooks = sorted(p.stem for p in (ROOT / "tutorials").glob("*.ipynb"))
    assert rendered == notebooks

    # Every public module has an entry (the api-module directive finds them itself) ...
    modindex = (html / "py-modindex.html").read_text(encoding="utf-8")
    missing = [name for name in _all_modules() if f">{name}<" not in modindex]
    assert not missing, f"modules without an API entry: {missing}"
    # ... and every public object a page of its own.
    for name in ("pyro_invariance.infer.training.fit", "pyro_invariance.registry.Registry"):
        assert (html / "api" / "generated" / f"{name}.html").is_file(), name


def test_links_and_anchors_resolve(html):
    ids: dict[Path, set[str]] = {}

    def anchors(page: Path) -> set[str]:
        if page not in ids:
            ids[page] = set(_ID.findall(page.read_text(encoding="utf-8")))
        return ids[page]

    broken, checked = [], 0
    for page in sorted(html.rglob("*.html")):
        for href in set(_HREF.findall(page.read_text(encoding="utf-8"))):
            url = urlsplit(href)
            if url.scheme or url.netloc or href.startswith("mailto:"):
                continue  # an external link: not followed (the build is offline)
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.is_file():
                broken.append(f"{page.relative_to(html)} -> {href}")
            elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in anchors(target):
                broken.append(f"{page.relative_to(html)} -> {href} (no such anchor)")
    assert checked > 1000
    assert not broken, f"{len(broken)} broken links:\n" + "\n".join(broken[:40])


def test_no_raw_markup_in_rendered_text(html):
    found = []
    for page in _pages(html):
        text = _prose(page)
        for what, pattern in RAW_MARKUP.items():
            for match in pattern.finditer(text):
                found.append(
                    f"{page.relative_to(html)}: {what}: {text[max(0, match.start() - 50) : match.end() + 30]!r}"
                )
    assert not found, f"{len(found)} places show markup:\n" + "\n".join(found[:40])


def test_tables_and_math_render_offline(html):
    # The comparison tables of the tutorials are ``text/markdown`` outputs: rendered as tables.
    for number in ("03", "04"):  # layer-wise equivariance (δ, γ, shares); swapping guides (compare_guides)
        (page,) = (html / "tutorials").glob(f"{number}_*.html")
        notebook = page.stem
        soup = bs4.BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        assert soup.select(".cell_output table"), f"{notebook}: no table among the cells' outputs"
        assert soup.select(".math"), f"{notebook}: no math"

    # MathJax comes from the build's own _static folder, never from a network.
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not copied into _static"
    for page in _pages(html):
        source = page.read_text(encoding="utf-8")
        remote = re.findall(r"""<(?:script|link)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]*)\"""", source)
        assert not remote, f"{page.relative_to(html)} loads {remote}"
        if 'class="math' in source:
            assert re.search(r"""<script\b[^>]*src="[^"]*_static/mathjax/tex-chtml\.js""", source), (
                f"{page.relative_to(html)} has math but no local MathJax"
            )


def test_cli_page_is_the_parser(html):
    """The command's page lists its options from the parser, and command lines stay literal."""
    source = (html / "api" / "cli.html").read_text(encoding="utf-8")
    text = bs4.BeautifulSoup(source, "html.parser").get_text()
    for option in ("--model", "--guides", "--resume", "--eval-subset", "--overwrite"):
        assert option in text, option
    assert "pyro-invariance fit --model invariant-mlp" in text
    assert 'id="pyro_invariance.cli.prepare_out"' not in source  # internal helpers stay off the page
